use std::vec::Vec;

use super::*;
use crate::platform::{DefaultRawMutex, Region};
use crate::testutil::{Rng, arena};

type Src = Region<DefaultRawMutex, 4>;

fn source(bytes: usize) -> &'static Src {
    let r: &'static Src = std::boxed::Box::leak(std::boxed::Box::new(Region::new()));
    r.add(arena(bytes), 0).unwrap();
    r
}

#[test]
fn geometry_waste_under_an_eighth() {
    for size in (8..=16384usize).step_by(8) {
        let align = 1usize << size.trailing_zeros().min(12);
        let g = Geometry::new(size, align).unwrap();
        assert!(g.capacity >= 1);
        assert_eq!(g.first % g.align, 0);
        assert!(g.first >= HEADER);
        let bytes = PAGE_SIZE << g.order;
        let waste = bytes - g.capacity * g.size;
        assert!(waste * 8 < bytes, "size {size}: {g:?} wastes {waste} of {bytes}");
    }
    assert_eq!(Geometry::new(64, 3), None, "alignment must be a power of two");
    assert_eq!(Geometry::new(64, 2 * PAGE_SIZE), None);
    assert_eq!(Geometry::new(2 << 20, 8), None, "larger than the largest slab");
    assert_eq!(Geometry::new(usize::MAX, 8), None);
    assert_eq!(Geometry::new(1, 1).unwrap().size, 8, "objects hold a link");
}

#[test]
fn alloc_free_reuse_and_reserve() {
    let src = source(4 << 20);
    let cache: &'static Cache<DefaultRawMutex> =
        std::boxed::Box::leak(std::boxed::Box::new(Cache::new(Geometry::new(128, 128).unwrap())));
    let cap = cache.geometry().capacity;
    let objs: Vec<_> = (0..cap * 4).map(|_| cache.alloc(&Pages::plain(src), 0).unwrap()).collect();
    cache.check();
    let st = cache.stats();
    assert_eq!(st.active_objects, cap * 4);
    assert_eq!(st.slabs, 4);
    for o in &objs {
        assert_eq!(o.as_ptr() as usize % 128, 0);
        // SAFETY: a live object of this cache.
        assert!(unsafe { cache.is_object(*o) });
    }
    // SAFETY: inside a live slab of this cache.
    assert!(!unsafe { cache.is_object(NonNull::new(objs[0].as_ptr().wrapping_add(8)).unwrap()) });
    for o in objs {
        // SAFETY: each live object is freed once.
        unsafe { cache.free(&Pages::plain(src), o) };
    }
    cache.check();
    let st = cache.stats();
    assert_eq!(st.active_objects, 0);
    assert_eq!(st.slabs, EMPTY_RESERVE, "empty slabs beyond the reserve went back");
    assert_eq!(src.stats().pages_in_use, EMPTY_RESERVE << cache.geometry().order);
    assert_eq!(cache.shrink(&Pages::plain(src)), EMPTY_RESERVE << cache.geometry().order);
    assert_eq!(src.stats().pages_in_use, 0);
}

#[test]
fn random_alloc_free_keeps_invariants() {
    let src = source(8 << 20);
    for &(size, align) in &[(8usize, 8usize), (24, 8), (192, 64), (1000, 8), (4096, 4096), (16384, 4096)] {
        let cache: &'static Cache<DefaultRawMutex> =
            std::boxed::Box::leak(std::boxed::Box::new(Cache::new(Geometry::new(size, align).unwrap())));
        let mut rng = Rng::new(size as u64);
        let mut live: Vec<(NonNull<u8>, u8)> = Vec::new();
        for step in 0..4000 {
            if live.is_empty() || rng.chance(60) {
                if let Ok(p) = cache.alloc(&Pages::plain(src), 0) {
                    let tag = step as u8;
                    // SAFETY: a fresh object of `size` bytes.
                    unsafe { core::ptr::write_bytes(p.as_ptr(), tag, size) };
                    live.push((p, tag));
                }
            } else {
                let (p, tag) = live.swap_remove(rng.below(live.len()));
                // SAFETY: a live object of `size` bytes.
                let s = unsafe { core::slice::from_raw_parts(p.as_ptr(), size) };
                assert!(s.iter().all(|&b| b == tag));
                // SAFETY: freed once.
                unsafe { cache.free(&Pages::plain(src), p) };
            }
            if step % 500 == 0 {
                cache.check();
            }
        }
        for (p, _) in live {
            // SAFETY: freed once.
            unsafe { cache.free(&Pages::plain(src), p) };
        }
        cache.check();
        cache.shrink(&Pages::plain(src));
        assert_eq!(cache.stats().slabs, 0);
    }
    assert_eq!(src.stats().pages_in_use, 0);
    src.check();
}

#[test]
fn grows_on_the_node_the_source_gives() {
    let r: &'static Src = std::boxed::Box::leak(std::boxed::Box::new(Region::new()));
    r.add(arena(1 << 20), 1).unwrap();
    let cache: &'static Cache<DefaultRawMutex> =
        std::boxed::Box::leak(std::boxed::Box::new(Cache::new(Geometry::new(64, 8).unwrap())));
    // Node 0 has no memory: the slab comes from node 1 and is listed there.
    let p = cache.alloc(&Pages::plain(r), 0).unwrap();
    cache.check();
    // SAFETY: live object, freed once.
    unsafe { cache.free(&Pages::plain(r), p) };
    cache.check();
    assert_eq!(cache.stats().active_objects, 0);
}
