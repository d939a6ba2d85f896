use super::*;
use crate::platform::PageSource;
use crate::platform::{DefaultRawMutex, Region};
use crate::testutil::arena;

#[test]
fn pages_for_edges() {
    assert_eq!(pages_for(0), Some(1));
    assert_eq!(pages_for(1), Some(1));
    assert_eq!(pages_for(PAGE_SIZE), Some(1));
    assert_eq!(pages_for(PAGE_SIZE + 1), Some(2));
    assert_eq!(pages_for(usize::MAX), None);
    assert_eq!(pages_for(usize::MAX - PAGE_SIZE + 2), None);
}

#[test]
fn exact_runs_give_back_their_tail() {
    let r: &'static Region<DefaultRawMutex, 4> = std::boxed::Box::leak(std::boxed::Box::new(Region::new()));
    r.add(arena(4 << 20), 0).unwrap();
    let p = alloc_exact(r, 5, 0, PAGE_SIZE, 0).unwrap().0;
    assert_eq!(r.stats().pages_in_use, 5, "the 3 tail pages of the order-3 run went back");
    // Alignment above the size: 1 page aligned to 64 KiB.
    let q = alloc_exact(r, 1, 0, 16 * PAGE_SIZE, 0).unwrap().0;
    assert_eq!(q.as_ptr() as usize % (16 * PAGE_SIZE), 0);
    assert_eq!(r.stats().pages_in_use, 6);
    // SAFETY: both runs are live and freed once with their page counts.
    unsafe {
        free_exact(r, p, 5);
        free_exact(r, q, 1);
    }
    assert_eq!(r.stats().pages_in_use, 0);
    r.check();
    assert_eq!(alloc_exact(r, usize::MAX / PAGE_SIZE, 0, PAGE_SIZE, 0), None);
}

#[test]
fn exact_runs_with_room_leave_the_pages_after_them_free() {
    let r: &'static Region<DefaultRawMutex, 4> = std::boxed::Box::leak(std::boxed::Box::new(Region::new()));
    r.add(arena(4 << 20), 0).unwrap();
    // 5 pages from a run of 32: still exact, and the 27 after them free.
    let p = alloc_exact(r, 5, 27, PAGE_SIZE, 0).unwrap().0;
    assert_eq!(r.stats().pages_in_use, 5);
    let end = NonNull::new(p.as_ptr().wrapping_add(5 * PAGE_SIZE)).unwrap();
    assert!(r.claim_pages(end, 27), "the room after the run was taken");
    assert_eq!(r.stats().pages_in_use, 32);
    // Room is capped at a run of 2^ROOM_MAX_ORDER pages.
    let q = alloc_exact(r, 1, usize::MAX, PAGE_SIZE, 0).unwrap().0;
    let end = NonNull::new(q.as_ptr().wrapping_add(PAGE_SIZE)).unwrap();
    assert!(r.claim_pages(end, (1 << ROOM_MAX_ORDER) - 1));
    // SAFETY: both runs are live and freed once with their page counts.
    unsafe {
        free_exact(r, p, 32);
        free_exact(r, q, 1 << ROOM_MAX_ORDER);
    }
    assert_eq!(r.stats().pages_in_use, 0);
    r.check();
}

#[test]
fn slab_base_masks_to_the_run() {
    let p = core::ptr::without_provenance_mut::<u8>(0x12345);
    assert_eq!(slab_base(p, 0).addr(), 0x12000);
    assert_eq!(slab_base(p, 2).addr(), 0x10000);
}
