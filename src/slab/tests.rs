use std::vec::Vec;

use super::geometry::MIN_ORDER;
use super::*;
use crate::counter::PageCounter;
use crate::platform::{DefaultRawMutex, PageSource, Region};
use crate::testutil::{Rng, arena};

type Src = Region<DefaultRawMutex, 4>;

fn source(bytes: usize) -> &'static Src {
    let r: &'static Src = std::boxed::Box::leak(std::boxed::Box::new(Region::new()));
    r.add(arena(bytes), 0).unwrap();
    r
}

/// A leaked cache of objects of `size` bytes aligned to `align`.
fn leaked_cache(size: usize, align: usize) -> &'static Cache<DefaultRawMutex> {
    std::boxed::Box::leak(std::boxed::Box::new(Cache::new(Geometry::new(size, align).unwrap())))
}

/// A leaked cache of `size`-byte objects aligned to `align` on a region of
/// `bytes`, and the objects of its first `slabs` slabs, all allocated.
fn full_slabs(
    bytes: usize,
    size: usize,
    align: usize,
    slabs: usize,
) -> (&'static Src, &'static Cache<DefaultRawMutex>, Vec<NonNull<u8>>) {
    let src = source(bytes);
    let cache = leaked_cache(size, align);
    let objs = (0..cache.geometry().capacity * slabs).map(|_| cache.alloc(&Pages::plain(src), 0).unwrap()).collect();
    (src, cache, objs)
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

/// Where memory maps on demand, a class's slabs waste under 1/32 where an
/// order up to `TIGHT_ORDER_MAX` allows it (the page-aligned 4 KiB class
/// lost a page in 16 to its header), else under 1/8 from `MIN_ORDER`.
#[test]
fn class_slabs_waste_under_a_32nd_up_to_the_tight_order() {
    use super::classes::{GEOMETRIES, NCLASSES};
    use super::geometry::TIGHT_ORDER_MAX;
    // A class's waste (in 32nds of the slab, rounded up) at order `o`.
    let waste = |g: &Geometry, o: u32| {
        let h = Geometry::in_order(g.size, g.align, o, 1).filter(|h| h.order == o)?;
        let bytes = PAGE_SIZE << o;
        Some((bytes - h.capacity * h.size) * 32 / bytes)
    };
    for g in GEOMETRIES.iter().take(NCLASSES) {
        let tight = (MIN_ORDER..=TIGHT_ORDER_MAX).find(|&o| waste(g, o) == Some(0));
        match tight {
            Some(o) => assert_eq!(g.order, o, "the first order to waste under 1/32: {g:?}"),
            None => {
                // The first under 1/8 (the 8, 14 and 16 KiB classes; in
                // hardened builds, whose bitmaps take more of a slab, the
                // 8-byte class too).
                let loose = (MIN_ORDER..=MAX_SLAB_ORDER).find(|&o| waste(g, o).is_some_and(|w| w < 4));
                assert_eq!(Some(g.order), loose, "{g:?}");
            }
        }
    }
    let four = GEOMETRIES.iter().find(|g| g.size == 4096).unwrap();
    assert_eq!((four.order, four.capacity), (6, 63));
}

#[test]
fn geometry_in_an_order_whatever_the_waste() {
    // 13 cache lines (a group with 64 CPU slots): two per page waste 768
    // bytes, over an eighth, so `smallest` picks order-2 slabs (`new` the
    // order after `MIN_ORDER`, the first to waste under 1/32: 640 bytes of
    // 64 KiB); `in_order` keeps single pages while two fit, in any source.
    let g = Geometry::in_order(1664, 128, 0, 2).unwrap();
    assert_eq!((g.order, g.capacity, g.first), (0, 2, 128));
    assert_eq!((0..=MAX_SLAB_ORDER).map(|cap| g.within(cap)).find(|h| *h != g), None);
    assert_eq!(Geometry::smallest(1664, 128).unwrap().order, 2);
    assert_eq!(Geometry::new(1664, 128).unwrap().order, MIN_ORDER + 1);
    // Two no longer fit a page: `new`'s choice.
    assert_eq!(Geometry::in_order(2048, 128, 0, 2), Geometry::new(2048, 128));
    assert_eq!(Geometry::in_order(1664, 3, 0, 2), None, "alignment must be a power of two");
    assert_eq!(Geometry::in_order(usize::MAX, 8, 0, 2), None);
}

/// Capped geometries (small page sources): within the cap where an
/// object fits, exact (no page past the last object), the smallest order
/// that holds one where none fits; today's layout once the cap allows it.
#[test]
fn capped_geometry_fits_small_sources() {
    use super::classes::{GEOMETRIES, NCLASSES};
    for cap in 0..=MAX_SLAB_ORDER {
        for (c, base) in GEOMETRIES.iter().enumerate().take(NCLASSES) {
            let g = base.within(cap);
            assert_eq!((g.size, g.align), (base.size, base.align));
            assert!(g.capacity >= 1 && g.first >= HEADER && g.first % g.align == 0, "{g:?}");
            assert!(g.first + g.capacity * g.size <= g.slab_pages() * PAGE_SIZE, "{g:?}");
            assert!(g.slab_pages() <= 1 << g.order);
            // A bounded source starts from the smallest slabs that waste
            // under an eighth, one that maps on demand from `MIN_ORDER`.
            let start = if cap < MAX_SLAB_ORDER { Geometry::smallest(base.size, base.align).unwrap() } else { *base };
            assert!(start.order <= base.order);
            if start.order <= cap {
                assert_eq!(g, start, "within the cap: unchanged");
            } else {
                // Exact: the last page holds part of an object.
                assert!(g.first + g.capacity * g.size > (g.slab_pages() - 1) * PAGE_SIZE, "{g:?}");
                let fits =
                    (0..=cap).any(|o| Geometry::capped(base.size, base.align, o).is_some_and(|h| h.order <= cap));
                if fits {
                    assert!(g.order <= cap, "class {c} at cap {cap}: {g:?}");
                } else {
                    assert_eq!(g.capacity, 1, "the smallest order that holds one: {g:?}");
                }
            }
        }
    }
    // A source that maps on demand: slabs of at least `MIN_ORDER`; a
    // bounded one of any size: one page for the 64-byte class.
    assert!(GEOMETRIES.iter().all(|g| g.order >= MIN_ORDER && g.within(MAX_SLAB_ORDER) == *g));
    let at = |size: usize, cap: u32| GEOMETRIES.iter().find(|g| g.size == size).unwrap().within(cap);
    assert!((0..MAX_SLAB_ORDER).all(|cap| at(64, cap).order == 0));
    assert!(
        GEOMETRIES.iter().filter(|g| g.size <= 448).all(|g| Geometry::smallest(g.size, g.align).unwrap().order == 0)
    );
    // Order 0 for every class up to 3.5 KiB; a page-aligned 4 KiB object
    // needs a header page: two pages; 8 KiB three, 16 KiB five.
    let at0 = |size: usize| at(size, 0);
    assert!(GEOMETRIES.iter().filter(|g| g.size <= 3584).all(|g| g.within(0).order == 0));
    assert_eq!((at0(4096).order, at0(4096).slab_pages()), (1, 2));
    assert_eq!((at0(8192).order, at0(8192).slab_pages()), (2, 3));
    assert_eq!((at0(16384).order, at0(16384).slab_pages()), (3, 5));
    assert_eq!(Geometry::capped(2 << 20, 8, 0), None, "larger than the largest slab");
    assert_eq!(Geometry::capped(64, 3, 0), None, "alignment must be a power of two");
}

#[test]
fn order_cap_is_an_eighth_of_the_pages() {
    assert_eq!(order_cap(None, None), MAX_SLAB_ORDER, "a source that grows on demand");
    assert_eq!(order_cap(Some(0), None), 0);
    assert_eq!(order_cap(Some(15), None), 0);
    assert_eq!(order_cap(Some(16), None), 1);
    assert_eq!(order_cap(Some(25), None), 1);
    assert_eq!(order_cap(Some(64), None), 3);
    assert_eq!(order_cap(Some(511), None), 5);
    assert_eq!(order_cap(Some(512), None), 6);
    assert_eq!(order_cap(Some(1 << 20), None), MAX_SLAB_ORDER);
    assert_eq!(order_cap(Some(1 << 20), Some(2)), 2, "no larger than the largest free run");
    assert_eq!(order_cap(None, Some(3)), MAX_SLAB_ORDER, "it maps a larger run when asked");
}

/// An exact slab (8 KiB objects capped at order 2: three pages of a
/// four-page run) keeps, charges and gives back only its three pages; the
/// fourth serves others meanwhile.
#[test]
fn exact_slabs_keep_charge_and_return_only_their_pages() {
    let g = Geometry::capped(8192, 4096, 2).unwrap();
    assert_eq!((g.order, g.slab_pages(), g.capacity), (2, 3, 1));
    assert!(g.is_exact());
    let src = source(64 * PAGE_SIZE);
    let counter: &'static PageCounter = std::boxed::Box::leak(std::boxed::Box::new(PageCounter::new_root()));
    let cache: &'static Cache<DefaultRawMutex> = std::boxed::Box::leak(std::boxed::Box::new(Cache::new(g)));
    let pg = Pages { src, counter: Some(counter), slot: None, owner: ptr::null(), overdraft: 0 };
    let free = src.free_pages_on(0);
    let objs: Vec<_> = (0..4).map(|_| cache.alloc(&pg, 0).unwrap()).collect();
    cache.check();
    assert_eq!(src.stats().pages_in_use, 12, "three pages a slab");
    assert_eq!(src.free_pages_on(0), free - 12, "the fourth page of each run went back");
    assert_eq!(counter.usage(), 12, "only the pages kept are charged");
    assert_eq!(cache.stats().pages, 12);
    for o in &objs {
        assert_eq!(o.as_ptr() as usize % PAGE_SIZE, 0);
        // SAFETY: a live object of this cache.
        assert!(unsafe { cache.is_object(*o) });
    }
    // The freed tail pages are anyone's: a page run takes them.
    let tails: Vec<_> = std::iter::from_fn(|| src.alloc_pages(0, 0)).take(4).collect();
    assert_eq!(tails.len(), 4);
    for o in objs {
        // SAFETY: each live object is freed once.
        unsafe { cache.free(&pg, o) };
    }
    cache.shrink(&pg);
    for t in tails {
        // SAFETY: runs of `src`, freed once.
        unsafe { src.free_pages(t.addr, t.order) };
    }
    assert_eq!(src.stats().pages_in_use, 0);
    assert_eq!(src.free_pages_on(0), free, "every page back, merged");
    assert_eq!(counter.usage(), 0);
    src.check();
}

#[test]
fn alloc_free_reuse_and_reserve() {
    let (src, cache, objs) = full_slabs(4 << 20, 128, 128, 4);
    let cap = cache.geometry().capacity;
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
        let cache = leaked_cache(size, align);
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
    let cache = leaked_cache(64, 8);
    // Node 0 has no memory: the slab comes from node 1 and is listed there.
    let p = cache.alloc(&Pages::plain(r), 0).unwrap();
    cache.check();
    // SAFETY: live object, freed once.
    unsafe { cache.free(&Pages::plain(r), p) };
    cache.check();
    assert_eq!(cache.stats().active_objects, 0);
}

/// Bulk takes and returns (the magazine refill and flush paths) in random
/// batches, the returns in random order so runs of one slab are short,
/// checked against a shadow set: no object is handed out twice, every
/// object keeps its contents while live, and the lists and bitmaps stay
/// consistent.
#[test]
fn bulk_alloc_free_model() {
    let src = source(8 << 20);
    for &(size, align) in &[(8usize, 8usize), (48, 16), (1024, 1024), (3072, 1024)] {
        let cache = leaked_cache(size, align);
        let mut rng = Rng::new(size as u64 ^ 0xb01c);
        let mut live: Vec<(*mut u8, u8)> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        let steps = if cfg!(miri) { 12 } else { 300 };
        for step in 0..steps {
            let n = 1 + rng.below(if cfg!(miri) { 20 } else { 150 });
            if live.len() < 64 || (live.len() < 1500 && rng.chance(55)) {
                let mut out = std::vec![core::ptr::null_mut(); n];
                let got = cache.alloc_bulk(&Pages::plain(src), 0, &mut out).unwrap();
                for &p in &out[..got] {
                    assert!(seen.insert(p as usize), "{p:p} handed out twice");
                    assert_eq!(p as usize % cache.geometry().align, 0);
                    let tag = (step as u8).wrapping_mul(31).wrapping_add(p as usize as u8);
                    // SAFETY: a fresh object of `size` bytes.
                    unsafe { core::ptr::write_bytes(p, tag, size) };
                    live.push((p, tag));
                }
            } else {
                let mut batch = Vec::new();
                for _ in 0..n.min(live.len()) {
                    let (p, tag) = live.swap_remove(rng.below(live.len()));
                    // SAFETY: a live object of `size` bytes.
                    let s = unsafe { core::slice::from_raw_parts(p, size) };
                    assert!(s.iter().all(|&b| b == tag), "object {p:p} was overwritten");
                    seen.remove(&(p as usize));
                    batch.push(p);
                }
                // SAFETY: distinct live objects of this cache, each freed once.
                unsafe { cache.free_bulk(&Pages::plain(src), &batch) };
            }
            cache.check();
            assert_eq!(cache.stats().active_objects, live.len());
        }
        let rest: Vec<_> = live.iter().map(|&(p, _)| p).collect();
        // SAFETY: as above.
        unsafe { cache.free_bulk(&Pages::plain(src), &rest) };
        cache.check();
        cache.shrink(&Pages::plain(src));
        assert_eq!(cache.stats().slabs, 0);
    }
    assert_eq!(src.stats().pages_in_use, 0);
}

/// Free objects hold nothing the slab reads: scribbling over them (a
/// write after free aimed at an intrusive free list) changes nothing the
/// slab hands out next.
#[test]
fn alloc_free_reuse_ignores_writes_after_free() {
    let (src, cache, objs) = full_slabs(1 << 20, 48, 16, 3);
    let mut target = [0u64; 8];
    for (i, o) in objs.iter().enumerate() {
        if i % 4 != 0 {
            // SAFETY: a live object, freed once; then the freed memory is
            // written, which the slab must not depend on.
            unsafe {
                cache.free(&Pages::plain(src), *o);
                o.as_ptr().cast::<*mut u64>().write_unaligned(target.as_mut_ptr());
                o.as_ptr().add(8).write_bytes(0xff, 40);
            }
        }
    }
    cache.check();
    let mut all: Vec<usize> = objs.iter().step_by(4).map(|o| o.as_ptr() as usize).collect();
    for _ in 0..objs.len() - all.len() {
        let p = cache.alloc(&Pages::plain(src), 0).unwrap();
        assert_ne!(p.as_ptr().cast::<u64>(), target.as_mut_ptr());
        // SAFETY: inside a live slab of this cache.
        assert!(unsafe { cache.is_object(p) });
        all.push(p.as_ptr() as usize);
    }
    all.sort();
    assert!(all.windows(2).all(|w| w[1] - w[0] >= 48), "two live objects overlap");
    cache.check();
}

/// A double free that reaches the slab finds the object's bit set and is
/// refused: the count and the bitmap stay right (outside hardened mode,
/// which aborts instead).
#[cfg(not(feature = "hardened"))]
#[test]
fn double_free_reaching_a_slab_is_refused() {
    let src = source(1 << 20);
    let cache = leaked_cache(64, 8);
    let a = cache.alloc(&Pages::plain(src), 0).unwrap();
    let b = cache.alloc(&Pages::plain(src), 0).unwrap();
    // SAFETY: `a` is live; the second free is the misuse under test, which
    // the slab must refuse without touching anything.
    unsafe {
        cache.free(&Pages::plain(src), a);
        cache.free(&Pages::plain(src), a);
    }
    cache.check();
    assert_eq!(cache.stats().active_objects, 1);
    let c = cache.alloc(&Pages::plain(src), 0).unwrap();
    let d = cache.alloc(&Pages::plain(src), 0).unwrap();
    assert!(c != d && c != b && d != b, "an object was handed out twice");
    cache.check();
}

/// `Geometry::index_of` (one multiplication for the quotient and the
/// divisibility test) against division, at every offset of a slab of
/// every size class and of odd sizes, and just past the slab.
#[test]
fn index_of_is_division() {
    let odd = [(24usize, 8usize), (40, 8), (56, 8), (72, 8), (100, 4), (4000, 16), (65_536, 4096)];
    let geos =
        crate::slab::classes::GEOMETRIES.iter().copied().chain(odd.iter().map(|&(s, a)| Geometry::new(s, a).unwrap()));
    for g in geos {
        let bytes = PAGE_SIZE << g.order;
        let step = if cfg!(miri) { g.size / 2 + 1 } else { 1 };
        for off in (0..2 * bytes).step_by(step) {
            let want = off.is_multiple_of(g.size).then_some(off / g.size);
            assert_eq!(g.index_of(off), want, "size {} offset {off}", g.size);
        }
    }
}

/// A batch given back to the slabs with misuse in it (the same object
/// twice in one run and across runs, a pointer inside an object, one
/// before the first object): the misuse is refused and the slabs' counts
/// and bitmaps stay right.
#[cfg(not(feature = "hardened"))]
#[test]
fn bulk_free_refuses_misuse_in_a_batch() {
    let (src, cache, objs) = full_slabs(1 << 20, 48, 16, 3);
    let per = cache.geometry().capacity;
    let o = |i: usize| objs[i].as_ptr();
    let first = cache.geometry().first;
    let slab0 = o(0).map_addr(|a| a & cache.geometry().slab_mask);
    let batch = [
        o(1),
        o(1),                 // twice in one run
        o(2).wrapping_add(8), // inside an object
        o(3),
        o(per),                         // the next slab
        o(1),                           // again, in another run
        slab0.wrapping_add(first - 16), // before the first object
        o(per + 1),
    ];
    // SAFETY: the live objects among them are distinct objects of this
    // cache; the rest is the misuse under test, which must be refused
    // without touching anything.
    unsafe { cache.free_bulk(&Pages::plain(src), &batch) };
    cache.check();
    assert_eq!(cache.stats().active_objects, objs.len() - 4, "only the four distinct objects went back");
    let mut again: Vec<usize> = (0..4).map(|_| cache.alloc(&Pages::plain(src), 0).unwrap().as_ptr() as usize).collect();
    again.sort();
    let mut want = [o(1), o(3), o(per), o(per + 1)].map(|p| p as usize);
    want.sort();
    assert_eq!(again, want, "the objects handed out again are the four that went back");
    cache.check();
}

/// Frees in runs of neighbouring objects, going up and going down (what
/// a magazine flush of objects freed in the order they were allocated
/// hands `free_bulk`), of every length from one to past a bitmap word
/// and across slab ends, with gaps, singles and, outside hardened mode,
/// objects already free inside a run: after every batch the slabs are
/// consistent, the count is the shadow's, and what is allocated again is
/// exactly what went back, each object once. (One object of each slab
/// stays live, so no slab goes back to the source under a double free.)
#[test]
fn bulk_free_of_neighbouring_runs_model() {
    for &(size, align) in &[(8usize, 8usize), (48, 16), (64, 8), (1024, 1024)] {
        let slabs = if cfg!(miri) { 2 } else { 4 };
        let (src, cache, objs) = full_slabs(8 << 20, size, align, slabs);
        let mut objs: Vec<*mut u8> = objs.iter().map(|p| p.as_ptr()).collect();
        objs.sort();
        let index: std::collections::BTreeMap<usize, usize> =
            objs.iter().enumerate().map(|(i, &p)| (p as usize, i)).collect();
        // The lowest object of each slab stays live, so that no slab goes
        // back to the source and a double free never reads a freed header.
        let mask = cache.geometry().slab_mask;
        let pinned: Vec<bool> =
            (0..objs.len()).map(|i| i == 0 || objs[i] as usize & mask != objs[i - 1] as usize & mask).collect();
        let mut live = std::vec![true; objs.len()];
        let mut nlive = objs.len();
        let mut rng = Rng::new(size as u64 ^ 0x5eed);
        let rounds = if cfg!(miri) { 6 } else { 200 };
        for round in 0..rounds {
            let mut batch = Vec::new();
            let mut freed = std::collections::BTreeSet::new();
            for _ in 0..1 + rng.below(4) {
                let most = if rng.chance(50) { 8 } else { 150 };
                let len = 1 + rng.below(most);
                let start = rng.below(objs.len());
                let up = rng.chance(50);
                for t in 0..len {
                    let Some(i) = (if up { start.checked_add(t) } else { start.checked_sub(t) }) else { break };
                    if i >= objs.len() {
                        break;
                    }
                    // Free ones in a run are gaps, or (not hardened, one
                    // round in four) double frees the slab must refuse.
                    let misuse = cfg!(not(feature = "hardened")) && round % 4 == 3;
                    if pinned[i] {
                        continue;
                    }
                    if (live[i] && freed.insert(i)) || (misuse && !live[i] && rng.chance(30)) {
                        batch.push(objs[i]);
                    }
                }
            }
            // SAFETY: the live objects in `batch` are distinct objects of
            // this cache, each freed once; the rest (not hardened) is the
            // misuse under test, which must be refused.
            unsafe { cache.free_bulk(&Pages::plain(src), &batch) };
            for &i in &freed {
                live[i] = false;
            }
            nlive -= freed.len();
            cache.check();
            assert_eq!(cache.stats().active_objects, nlive, "round {round}, size {size}");
            // Take some back: each must be one of ours that is free.
            let n = rng.below(objs.len() - nlive + 1);
            let mut out = std::vec![core::ptr::null_mut(); n];
            let got = cache.alloc_bulk(&Pages::plain(src), 0, &mut out).unwrap();
            for &p in &out[..got] {
                let i = *index.get(&(p as usize)).expect("an object outside the slabs freed into");
                assert!(!live[i], "{p:p} handed out twice");
                live[i] = true;
            }
            nlive += got;
            cache.check();
            assert_eq!(cache.stats().active_objects, nlive);
        }
    }
}
