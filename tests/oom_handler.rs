//! The out-of-memory handler (`Kmem::set_oom_handler`): a kernel whose
//! page source runs dry adds a region on demand and the allocation
//! retries once; a handler that adds nothing ends in a clean failure after
//! one call, and one that allocates does not recurse.

use std::alloc::{GlobalAlloc, Layout};
use std::mem::MaybeUninit;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use kmemcg::{DefaultRawMutex, Kmem, NoCpus, PageSource, Region};

type RKmem = Kmem<Region, DefaultRawMutex, NoCpus>;

/// Memory handed to the allocator, leaked for `'static`, aligned to 64 KiB.
fn leaked(bytes: usize) -> &'static mut [MaybeUninit<u8>] {
    let v: &'static mut [MaybeUninit<u8>] =
        Box::leak(vec![MaybeUninit::uninit(); bytes + (1 << 16)].into_boxed_slice());
    let skew = v.as_ptr().align_offset(1 << 16);
    &mut v[skew..skew + bytes]
}

static CALLS: AtomicUsize = AtomicUsize::new(0);
static SPARE: Mutex<Vec<&'static mut [MaybeUninit<u8>]>> = Mutex::new(Vec::new());

/// Adds one spare region, if any is left.
fn add_spare(k: &RKmem, pages: usize) -> bool {
    CALLS.fetch_add(1, Ordering::SeqCst);
    assert!(pages >= 1);
    match SPARE.lock().unwrap().pop() {
        Some(mem) => k.source().add(mem, 0).is_ok(),
        None => false,
    }
}

#[test]
fn a_handler_adds_regions_on_demand_and_the_allocation_retries() {
    let k: &'static RKmem = Box::leak(Box::new(Kmem::with_platform(Region::new(), NoCpus::new())));
    k.source().add(leaked(256 << 10), 0).unwrap();
    {
        let mut spare = SPARE.lock().unwrap();
        for _ in 0..8 {
            spare.push(leaked(1 << 20));
        }
    }
    k.set_oom_handler(Some(add_spare));
    let small = Layout::from_size_align(256, 8).unwrap();
    let large = Layout::from_size_align(200 << 10, 8).unwrap();
    let mut kept = Vec::new();
    // Far more than the first region holds: every time it runs dry, the
    // handler adds a region and the allocation goes on.
    for i in 0..12_000 {
        let l = if i % 1000 == 999 { large } else { small };
        // SAFETY: a valid layout.
        let p = unsafe { k.alloc(l) };
        assert!(!p.is_null(), "allocation {i} failed with {} handler calls", CALLS.load(Ordering::SeqCst));
        kept.push((p, l));
    }
    let calls = CALLS.load(Ordering::SeqCst);
    assert!((1..=8).contains(&calls), "{calls} handler calls");
    assert!(SPARE.lock().unwrap().len() < 8);
    // Once the spares are gone, allocations fail cleanly: one more
    // handler call each, no loop.
    let mut failed = 0;
    for _ in 0..100_000 {
        // SAFETY: a valid layout.
        let p = unsafe { k.alloc(large) };
        if p.is_null() {
            failed += 1;
            break;
        }
        kept.push((p, large));
    }
    assert_eq!(failed, 1, "the source never ran dry");
    let before = CALLS.load(Ordering::SeqCst);
    // SAFETY: a valid layout.
    assert!(unsafe { k.alloc(large) }.is_null());
    assert_eq!(CALLS.load(Ordering::SeqCst), before + 1, "one call per failed allocation");
    for (p, l) in kept {
        // SAFETY: allocated above with this layout, freed once.
        unsafe { k.dealloc(p, l) };
    }
    k.shrink();
    assert_eq!(k.source().stats().pages_in_use, 0);
}

static NESTED: AtomicUsize = AtomicUsize::new(0);

/// A handler that allocates from the allocator that called it: its own
/// allocation fails (the source is dry) without calling it again.
fn allocating_handler(k: &RKmem, _pages: usize) -> bool {
    NESTED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: a valid layout; freed if it succeeds.
    unsafe {
        let l = Layout::from_size_align(100 << 10, 8).unwrap();
        let p = k.alloc(l);
        if !p.is_null() {
            k.dealloc(p, l);
        }
    }
    true // claims memory was added, though none was: the retry fails
}

#[test]
fn a_handler_that_allocates_or_lies_is_called_once() {
    let k: &'static RKmem = Box::leak(Box::new(Kmem::with_platform(Region::new(), NoCpus::new())));
    k.source().add(leaked(128 << 10), 0).unwrap();
    k.set_oom_handler(Some(allocating_handler));
    let l = Layout::from_size_align(1 << 20, 8).unwrap();
    // SAFETY: a valid layout.
    assert!(unsafe { k.alloc(l) }.is_null());
    assert_eq!(NESTED.load(Ordering::SeqCst), 1);
    k.set_oom_handler(None);
    // SAFETY: a valid layout.
    assert!(unsafe { k.alloc(l) }.is_null());
    assert_eq!(NESTED.load(Ordering::SeqCst), 1);
}
