//! The `Allocator` handle and the public bad-input contract, over a `Region`.

use core::alloc::{GlobalAlloc, Layout};
use core::mem::MaybeUninit;

use allocator_api2::alloc::Allocator;
use allocator_api2::vec::Vec as AVec;
use kmemcg::{Kmem, PageSource, Region};

fn kmem(bytes: usize) -> &'static Kmem<Region> {
    let k: &'static Kmem<Region> = Box::leak(Box::new(Kmem::new(Region::new())));
    k.source().add(Box::leak(vec![MaybeUninit::uninit(); bytes].into_boxed_slice()), 0).unwrap();
    k
}

#[test]
fn vec_in_kmem() {
    let k = kmem(16 << 20);
    let mut v = AVec::new_in(k);
    for i in 0..100_000u32 {
        v.push(i);
    }
    assert_eq!(v.iter().map(|&x| x as u64).sum::<u64>(), 4_999_950_000);
    v.truncate(10);
    v.shrink_to_fit();
    assert_eq!(&v[..], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    drop(v);
    k.shrink();
    assert_eq!(k.source().stats().pages_in_use, 0);
}

#[test]
fn allocate_reports_usable_size_and_zero_size_is_dangling() {
    let k = kmem(4 << 20);
    let a = (&k).allocate(Layout::from_size_align(100, 8).unwrap()).unwrap();
    // With red zones or poison on (KMEMCG_DEBUG), the block is exactly the
    // request: the rest of the slot is red zone. So is a block sampled
    // onto a guard page (`KMEMCG_DEBUG=sampled`: it ends at the page);
    // with sampling alone the others are plain objects of their class.
    let d = k.detection();
    let sampled = (a.cast::<u8>().as_ptr() as usize + 104).is_multiple_of(4096) && d.guard_every() != 0;
    let usable = if d.redzones_on() || d.poison_on() || sampled { 100 } else { 112 };
    assert_eq!(a.len(), usable, "the 112-byte class");
    // SAFETY: deallocating with any size between request and usable length
    // (the usable length itself).
    unsafe { (&k).deallocate(a.cast(), Layout::from_size_align(usable, 8).unwrap()) };
    let z = (&k).allocate(Layout::from_size_align(0, 64).unwrap()).unwrap();
    assert_eq!(z.len(), 0);
    assert_eq!(z.cast::<u8>().as_ptr() as usize % 64, 0);
    // SAFETY: zero-size blocks are not memory; deallocate is a no-op.
    unsafe { (&k).deallocate(z.cast(), Layout::from_size_align(0, 64).unwrap()) };
    k.shrink();
    assert_eq!(k.stats().source.pages_in_use, 0, "shrink empties magazines and gives every slab back");
}

#[test]
fn grow_and_shrink_change_alignment() {
    let k = kmem(4 << 20);
    let old = Layout::from_size_align(24, 8).unwrap();
    let p = (&k).allocate(old).unwrap().cast::<u8>();
    // SAFETY: a live 24-byte block.
    unsafe { p.as_ptr().copy_from(b"abcdefghijklmnopqrstuvwx".as_ptr(), 24) };
    let new = Layout::from_size_align(5000, 4096).unwrap();
    // SAFETY: `p` is live with `old`; 5000 >= 24.
    let q = unsafe { (&k).grow(p, old, new) }.unwrap().cast::<u8>();
    assert_eq!(q.as_ptr() as usize % 4096, 0);
    // SAFETY: the first 24 bytes were carried over.
    assert_eq!(unsafe { core::slice::from_raw_parts(q.as_ptr(), 24) }, b"abcdefghijklmnopqrstuvwx");
    let small = Layout::from_size_align(3, 1).unwrap();
    // SAFETY: `q` is live with `new`.
    let r = unsafe { (&k).shrink(q, new, small) }.unwrap().cast::<u8>();
    // SAFETY: three bytes survive.
    assert_eq!(unsafe { core::slice::from_raw_parts(r.as_ptr(), 3) }, b"abc");
    // SAFETY: live with `small`.
    unsafe { (&k).deallocate(r, small) };
}

#[test]
fn global_alloc_bad_input() {
    let k = kmem(2 << 20);
    // SAFETY: each call passes a valid `Layout`; null is the expected answer.
    unsafe {
        assert!(k.alloc(Layout::from_size_align(0, 1).unwrap()).is_null(), "zero size");
        assert!(k.alloc(Layout::from_size_align(isize::MAX as usize - 4095, 4096).unwrap()).is_null());
        assert!(k.alloc(Layout::from_size_align(1 << 30, 8).unwrap()).is_null(), "exhausted region");
        assert!(k.alloc(Layout::from_size_align(8, 1 << 30).unwrap()).is_null(), "alignment beyond the region");
        let ok = Layout::from_size_align(64, 64).unwrap();
        let p = k.alloc(ok);
        assert!(!p.is_null());
        assert!(k.realloc(p, ok, isize::MAX as usize - 63).is_null(), "realloc to huge keeps the block");
        p.write_bytes(9, 64);
        let over_page = Layout::from_size_align(64, 1 << 16).unwrap();
        let q = k.alloc(over_page);
        assert_eq!(q as usize % (1 << 16), 0, "alignment above a page goes to the page path");
        k.dealloc(q, over_page);
        assert!(core::slice::from_raw_parts(p, 64).iter().all(|&b| b == 9));
        k.dealloc(p, ok);
    }
    assert!((&k).allocate(Layout::from_size_align(1 << 30, 8).unwrap()).is_err());
}
