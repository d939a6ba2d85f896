//! A callback of the allocator (the event hook, a shrinker, the
//! out-of-memory handler) runs inside an allocation that goes on charging
//! the group its thread's token names, on the token's reference alone.
//! A callback that dropped that reference (resetting the current group,
//! or dropping a guard it kept) and removed the group let the allocation
//! go on in freed memory: an allocation in a group at `max` 0 succeeded,
//! charged to a group made in the freed one's place (found by a review).
//! Now the callback runs under a reference of its own on the group, and
//! leaves its thread's current group as it found it.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use kmemcg::{
    CacheFlags, Cgroup, Error, Event, GroupId, Kmem, OsPages, PAGE_SIZE, Platform, Region, ShrinkControl, Shrinker,
};

type K = Kmem<OsPages>;

static HOOK_KMEM: OnceLock<&'static K> = OnceLock::new();
static HOOK_GROUP: Mutex<Option<Cgroup<'static, K>>> = Mutex::new(None);
static HOOK_MADE: Mutex<Option<Cgroup<'static, K>>> = Mutex::new(None);

/// On the first `max` event: drops every reference the current group has
/// but the allocation's (the token's, the handle's), removes it, shrinks,
/// and makes a group that may take its memory.
fn freeing_hook(_: GroupId, e: Event) {
    if e != Event::Max {
        return;
    }
    let Some(g) = HOOK_GROUP.lock().unwrap().take() else { return };
    let k = *HOOK_KMEM.get().unwrap();
    k.reset_current_group();
    g.remove().unwrap();
    drop(g);
    k.shrink();
    *HOOK_MADE.lock().unwrap() = Some(k.root().create_child("h").unwrap());
}

#[test]
fn an_event_hook_that_frees_the_current_group_cannot_free_it_under_the_allocation() {
    let k: &'static K = Box::leak(Box::new(Kmem::new(OsPages::new())));
    HOOK_KMEM.set(k).ok();
    let cache = Box::leak(Box::new(k.create_cache::<[u64; 32]>("objs", CacheFlags::ACCOUNT).unwrap()));
    let g = k.root().create_child("g").unwrap();
    g.set_max(0).unwrap();
    std::mem::forget(g.enter());
    *HOOK_GROUP.lock().unwrap() = Some(g);
    k.set_event_hook(Some(freeing_hook));
    let r = cache.alloc([7u64; 32]);
    k.set_event_hook(None);
    let h = HOOK_MADE.lock().unwrap().take().expect("the hook ran");
    assert!(
        matches!(r, Err(Error::LimitExceeded { max: 0, .. })),
        "an allocation passed max 0: {:?}",
        r.as_ref().err()
    );
    assert_eq!(h.usage(), 0, "the allocation charged a group nobody entered");
    // The token names the removed group again (whose allocations charge
    // its online ancestor, the root).
    assert!(!k.platform().current_group().is_null(), "the hook's reset of the current group was not undone");
    assert_eq!(k.current_group().name(), "/");
    // The thread's token still holds the removed group: let it go.
    k.reset_current_group();
    k.shrink();
    assert_eq!(h.usage(), 0);
}

static SHRINK_KMEM: OnceLock<&'static K> = OnceLock::new();
static SHRINK_OTHER: Mutex<Option<Cgroup<'static, K>>> = Mutex::new(None);
static SHRINK_RAN: AtomicBool = AtomicBool::new(false);

/// A shrinker that resets its thread's current group, then enters another
/// group for good (a forgotten guard).
struct Wanderer;

impl Shrinker for Wanderer {
    fn count(&self, _: &ShrinkControl) -> usize {
        1
    }
    fn scan(&self, _: &ShrinkControl, _: usize) -> usize {
        SHRINK_RAN.store(true, Ordering::Relaxed);
        let k = *SHRINK_KMEM.get().unwrap();
        k.reset_current_group();
        if let Some(o) = SHRINK_OTHER.lock().unwrap().as_ref() {
            std::mem::forget(o.enter());
        }
        0
    }
}

#[test]
fn a_shrinker_leaves_its_threads_current_group_as_it_found_it() {
    let k: &'static K = Box::leak(Box::new(Kmem::new(OsPages::new())));
    SHRINK_KMEM.set(k).ok();
    k.register_shrinker(&Wanderer).unwrap();
    let g = k.root().create_child("g").unwrap();
    let other = k.root().create_child("other").unwrap();
    *SHRINK_OTHER.lock().unwrap() = Some(other.clone());
    g.set_max(64 << 10).unwrap();
    let guard = g.enter();
    // Past the max: the reclaim runs the shrinker, and the allocation fails.
    let layout = std::alloc::Layout::from_size_align(256 << 10, 8).unwrap();
    // SAFETY: a non-zero size.
    assert!(unsafe { core::alloc::GlobalAlloc::alloc(k, layout) }.is_null());
    assert!(SHRINK_RAN.load(Ordering::Relaxed), "the shrinker ran");
    assert_eq!(k.current_group().name(), "g", "the shrinker's change of the current group was not undone");
    drop(guard);
    assert_eq!(k.current_group().name(), "/");
    SHRINK_OTHER.lock().unwrap().take();
    k.shrink();
    assert_eq!(other.usage(), 0, "nothing was charged to the group the shrinker entered");
    assert_eq!(g.usage(), 0);
}

static OOM_OTHER: Mutex<Option<Cgroup<'static, Kmem<Region>>>> = Mutex::new(None);
static OOM_RAN: AtomicBool = AtomicBool::new(false);

/// An out-of-memory handler that enters another group for good, then
/// adds no memory.
fn wandering_handler(_: &Kmem<Region>, _: usize) -> bool {
    OOM_RAN.store(true, Ordering::Relaxed);
    if let Some(o) = OOM_OTHER.lock().unwrap().as_ref() {
        std::mem::forget(o.enter());
    }
    false
}

#[test]
fn an_oom_handler_leaves_its_threads_current_group_as_it_found_it() {
    let k: &'static Kmem<Region> = Box::leak(Box::new(Kmem::new(Region::new())));
    k.source().add(Box::leak(vec![MaybeUninit::uninit(); 64 * PAGE_SIZE].into_boxed_slice()), 0).unwrap();
    let g = k.root().create_child("g").unwrap();
    let other = k.root().create_child("other").unwrap();
    *OOM_OTHER.lock().unwrap() = Some(other.clone());
    k.set_oom_handler(Some(wandering_handler));
    let guard = g.enter();
    let layout = std::alloc::Layout::from_size_align(1 << 20, 8).unwrap();
    // SAFETY: a non-zero size.
    let p = unsafe { core::alloc::GlobalAlloc::alloc(k, layout) };
    assert!(p.is_null(), "a 1 MiB block from a 256 KiB region");
    assert!(OOM_RAN.load(Ordering::Relaxed), "the handler ran");
    assert_eq!(k.current_group().name(), "g", "the handler's change of the current group was not undone");
    drop(guard);
    // The same with the root current.
    OOM_RAN.store(false, Ordering::Relaxed);
    // SAFETY: a non-zero size.
    assert!(unsafe { core::alloc::GlobalAlloc::alloc(k, layout) }.is_null());
    assert!(OOM_RAN.load(Ordering::Relaxed), "the handler ran");
    assert!(k.platform().current_group().is_null(), "the handler's group stayed current where the root was");
    k.set_oom_handler(None);
    OOM_OTHER.lock().unwrap().take();
    assert_eq!(other.usage(), 0);
}
