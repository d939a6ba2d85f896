//! Small regions (shared by `examples/small_regions.rs` and
//! `tests/small_regions.rs`): a `Kmem` over one `Region` of a few KiB to a
//! MiB, as a hobby kernel's heap or a microcontroller's RAM, measured and
//! run through a tutorial kernel's heap tests.

use std::alloc::{GlobalAlloc, Layout};
use std::mem::MaybeUninit;

use allocator_api2::boxed::Box as ABox;
use allocator_api2::vec::Vec as AVec;
use kmemcg::{DefaultRawMutex, Kmem, MAX_CLASS_SIZE, NoCpus, PAGE_SIZE, PageSource, Region};

/// A kernel's allocator: one context (no per-CPU slots to fill).
pub type SmallKmem = Kmem<Region, DefaultRawMutex, NoCpus>;

/// The region sizes of the table.
pub const SIZES: [usize; 6] = [16 << 10, 32 << 10, 64 << 10, 100 << 10, 256 << 10, 1 << 20];

/// `bytes` of leaked memory starting `skew` bytes past a 1 MiB boundary
/// (0: page aligned, as a kernel maps its heap; the table's numbers do not
/// depend on where the allocation landed).
pub fn leaked(bytes: usize, skew: usize) -> &'static mut [MaybeUninit<u8>] {
    let v: &'static mut [MaybeUninit<u8>] =
        Box::leak(vec![MaybeUninit::uninit(); bytes + skew + (1 << 20)].into_boxed_slice());
    let at = v.as_ptr().align_offset(1 << 20) + skew;
    &mut v[at..at + bytes]
}

/// A fresh allocator over one region of `bytes` (`skew` as for [`leaked`]).
pub fn small_kmem(bytes: usize, skew: usize) -> &'static SmallKmem {
    let k: &'static SmallKmem = Box::leak(Box::new(Kmem::with_platform(Region::new(), NoCpus::new())));
    k.source().add(leaked(bytes, skew), 0).expect("the region is accepted");
    k
}

/// [`small_kmem`] with detection off whatever `KMEMCG_DEBUG` says, for
/// what counts pages and classes exactly: red zones, quarantine and guard
/// pages change both.
#[allow(dead_code)] // used by tests/small_regions.rs, not by the example
pub fn small_kmem_exact(bytes: usize, skew: usize) -> &'static SmallKmem {
    let k: &'static SmallKmem =
        Box::leak(Box::new(Kmem::with_platform(Region::new(), NoCpus::new()).with_detection(kmemcg::Detection::OFF)));
    k.source().add(leaked(bytes, skew), 0).expect("the region is accepted");
    k
}

/// What one region size gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// The region's length.
    pub bytes: usize,
    /// The slab order cap the allocator chose.
    pub max_order: u32,
    /// Bytes of the region it keeps for itself (partial pages and page
    /// metadata).
    pub region_meta: usize,
    /// Bytes the allocator's own caches hold once it has served 64-byte
    /// boxes (their magazines).
    pub kmem_meta: usize,
    /// The largest size (8-byte aligned) such that one allocation of any
    /// size up to it succeeds first thing in a fresh allocator.
    pub largest: usize,
    /// 64-byte boxes that fit before the first failure.
    pub boxes64: usize,
}

/// Runs `f` on a fresh allocator over `bytes` of `buf` (page aligned,
/// reused from one call to the next: the allocator and its region are
/// dropped before it returns).
fn fresh<T>(buf: *mut u8, bytes: usize, f: impl FnOnce(&SmallKmem) -> T) -> T {
    // Detection off whatever `KMEMCG_DEBUG` says: the table counts pages.
    let k: Box<SmallKmem> =
        Box::new(Kmem::with_platform(Region::new(), NoCpus::new()).with_detection(kmemcg::Detection::OFF));
    // SAFETY: `buf` holds `bytes` bytes that only this allocator uses, and
    // it is dropped (with its region) at the end of this call.
    unsafe { k.source().add_raw(buf, bytes, 0) }.expect("the region is accepted");
    f(&k)
}

/// Whether a fresh allocator over `bytes` of `buf` serves one `size`-byte
/// block.
fn fresh_serves(buf: *mut u8, bytes: usize, size: usize) -> bool {
    fresh(buf, bytes, |k| {
        let layout = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: a valid, non-zero layout; freed with it.
        unsafe {
            let p = k.alloc(layout);
            if !p.is_null() {
                k.dealloc(p, layout);
            }
            !p.is_null()
        }
    })
}

/// Measures one region size (page aligned, as a kernel heap).
pub fn measure(bytes: usize) -> Row {
    // 1 MiB aligned, so the rows do not depend on where the buffer landed.
    let layout = Layout::from_size_align(bytes, 1 << 20).unwrap();
    // SAFETY: a non-zero size; freed below, after its last allocator.
    let buf = unsafe { std::alloc::alloc(layout) };
    assert!(!buf.is_null());
    let (max_order, region_meta, kmem_meta, boxes64) = fresh(buf, bytes, |k| {
        let region_meta = bytes - k.source().stats().pages_reserved * PAGE_SIZE;
        let layout = Layout::from_size_align(64, 8).unwrap();
        let mut boxes = Vec::new();
        loop {
            // SAFETY: a valid, non-zero layout.
            let p = unsafe { k.alloc(layout) };
            if p.is_null() {
                break;
            }
            boxes.push(p);
        }
        let info = k.slabinfo().to_string();
        let mags = info.lines().find(|l| l.starts_with("kmem_magazine")).expect("a magazine row");
        let pages: usize = mags.split_whitespace().nth(10).unwrap().parse().unwrap();
        let boxes64 = boxes.len();
        for p in boxes {
            // SAFETY: allocated above with this layout, freed once.
            unsafe { k.dealloc(p, layout) };
        }
        (k.max_slab_order(), region_meta, pages * PAGE_SIZE, boxes64)
    });
    // Every size class in turn, then the page path (whole pages: one
    // more byte needs one more page), until the first failure.
    let mut largest = 0;
    let classes = (1..=MAX_CLASS_SIZE).filter(|&s| kmemcg_class(s) == s);
    let mut sizes = classes.chain((MAX_CLASS_SIZE / PAGE_SIZE + 1..).map(|p| p * PAGE_SIZE));
    for size in sizes.by_ref() {
        if size > bytes || !fresh_serves(buf, bytes, size) {
            break;
        }
        largest = size;
    }
    // SAFETY: allocated above with this layout; its allocators are gone.
    unsafe { std::alloc::dealloc(buf, layout) };
    Row { bytes, max_order, region_meta, kmem_meta, largest, boxes64 }
}

/// The size class a request of `size` bytes (8-byte aligned) gets: the
/// usable size the `Allocator` API reports.
fn kmemcg_class(size: usize) -> usize {
    use allocator_api2::alloc::Allocator;
    thread_local! {
        static K: &'static SmallKmem = small_kmem(1 << 20, 0);
    }
    K.with(|k| {
        let layout = Layout::from_size_align(size, 8).unwrap();
        let p = k.allocate(layout).expect("a 1 MiB region serves every class");
        // SAFETY: allocated just above with this layout.
        unsafe { k.deallocate(p.cast(), layout) };
        p.len()
    })
}

/// A tutorial x86_64 kernel's heap tests (a `Box`, a `Vec<u64>` pushed to
/// 1,000 elements, 100,000 short-lived boxes, a long-lived box held across
/// that churn), through the `Allocator` API. Panics on a failure, with the
/// allocator's report of it.
pub fn tutorial(k: &'static SmallKmem) {
    let fail = |what: &str| -> ! {
        match k.last_oom() {
            Some(r) => panic!("{what} failed: {r}"),
            None => panic!("{what} failed, with no shortage recorded"),
        }
    };
    // simple_allocation
    let a = ABox::try_new_in(41u64, k).unwrap_or_else(|_| fail("a box"));
    let b = ABox::try_new_in(13u64, k).unwrap_or_else(|_| fail("a box"));
    assert_eq!((*a, *b), (41, 13));
    drop((a, b));
    // large_vec
    let n = 1000u64;
    let mut v = AVec::new_in(k);
    for i in 0..n {
        if v.try_reserve(1).is_err() {
            fail("growing the vec");
        }
        v.push(i);
    }
    assert_eq!(v.iter().sum::<u64>(), (n - 1) * n / 2);
    drop(v);
    // many_boxes
    for i in 0..100_000u64 {
        let x = ABox::try_new_in(i, k).unwrap_or_else(|_| fail("a short-lived box"));
        assert_eq!(*x, i);
    }
    // many_boxes_long_lived
    let long_lived = ABox::try_new_in(1u64, k).unwrap_or_else(|_| fail("the long-lived box"));
    for i in 0..100_000u64 {
        let x = ABox::try_new_in(i, k).unwrap_or_else(|_| fail("a short-lived box"));
        assert_eq!(*x, i);
    }
    assert_eq!(*long_lived, 1);
}
