//! A callback of one allocator runs while a group of another allocator is
//! current on its thread (an allocation of `A` refused while `B`'s group
//! is entered). The callback's changes to the current group are undone
//! when it returns, whichever allocator's group was current: before, only
//! a group of the calling allocator was put back, so `B`'s group was lost
//! and `B`'s next allocation escaped its `max` (found by a review).

use std::alloc::{GlobalAlloc, Layout};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use kmemcg::{Cgroup, Kmem, OsPages, PAGE_SIZE, Region};

type A = Kmem<Region>;
type B = Kmem<OsPages>;

static KB: OnceLock<&'static B> = OnceLock::new();
static A_OTHER: Mutex<Option<Cgroup<'static, A>>> = Mutex::new(None);
static RAN: AtomicBool = AtomicBool::new(false);
/// 0: the handler resets `B`'s current group; 1: it enters a group of `A`
/// and forgets the guard; 2: it does both.
static MODE: Mutex<u8> = Mutex::new(0);

fn handler(_: &A, _: usize) -> bool {
    RAN.store(true, Ordering::SeqCst);
    let mode = *MODE.lock().unwrap();
    if mode != 1 {
        KB.get().unwrap().reset_current_group();
    }
    if mode != 0 {
        std::mem::forget(A_OTHER.lock().unwrap().as_ref().unwrap().enter());
    }
    false
}

#[test]
fn a_callback_of_one_allocator_leaves_anothers_current_group_as_it_found_it() {
    let ka: &'static A = Box::leak(Box::new(Kmem::new(Region::new())));
    ka.source().add(Box::leak(vec![MaybeUninit::uninit(); 64 * PAGE_SIZE].into_boxed_slice()), 0).unwrap();
    let kb: &'static B = Box::leak(Box::new(Kmem::new(OsPages::new())));
    KB.set(kb).ok();
    let gb = kb.root().create_child("gb").unwrap();
    gb.set_max(64 << 10).unwrap();
    *A_OTHER.lock().unwrap() = Some(ka.root().create_child("other").unwrap());
    ka.set_oom_handler(Some(handler));
    let large = Layout::from_size_align(1 << 20, 8).unwrap();
    for mode in [0u8, 1, 2] {
        *MODE.lock().unwrap() = mode;
        RAN.store(false, Ordering::SeqCst);
        let guard = gb.enter();
        // SAFETY: a non-zero size; more than `A`'s region holds.
        assert!(unsafe { ka.alloc(large) }.is_null());
        assert!(RAN.load(Ordering::SeqCst), "the out-of-memory handler ran");
        assert_eq!(kb.current_group().name(), "gb", "mode {mode}: B's current group after A's handler");
        assert_eq!(ka.current_group().name(), "/", "mode {mode}: A's current group after its handler");
        // gb's max is 64 KiB: 1 MiB fails in it.
        // SAFETY: a non-zero size.
        let p = unsafe { kb.alloc(large) };
        assert!(p.is_null(), "mode {mode}: an allocation past gb's max succeeded");
        drop(guard);
        assert_eq!(kb.current_group().name(), "/");
    }
    // Every reference the handler's scopes took went back: the groups go.
    ka.set_oom_handler(None);
    let other = A_OTHER.lock().unwrap().take().unwrap();
    other.remove().unwrap();
    gb.remove().unwrap();
    drop((other, gb));
    ka.shrink();
    kb.shrink();
    assert_eq!(ka.root().usage(), 0);
    assert_eq!(kb.root().usage(), 0);
}
