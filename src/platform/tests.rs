use std::collections::BTreeMap;
use std::vec::Vec;

use super::*;
use crate::testutil::{Rng, arena, scaled};

type R = Region<DefaultRawMutex, 8>;

fn leak<T>(v: T) -> &'static T {
    std::boxed::Box::leak(std::boxed::Box::new(v))
}

#[test]
fn order_for_pages_edges() {
    assert_eq!(order_for_pages(0), Some(0));
    assert_eq!(order_for_pages(1), Some(0));
    assert_eq!(order_for_pages(2), Some(1));
    assert_eq!(order_for_pages(3), Some(2));
    assert_eq!(order_for_pages(1 << 27), Some(27));
    assert_eq!(order_for_pages((1 << 27) + 1), None);
    assert_eq!(order_for_pages(usize::MAX), None);
}

#[test]
fn region_errors() {
    let r = leak(R::new());
    assert_eq!(r.add(arena(8 * PAGE_SIZE), MAX_NODES), Err(RegionError::BadNode));
    assert!(matches!(r.add(arena(PAGE_SIZE), 0), Err(RegionError::TooSmall { .. })));
    let mem = arena(64 * PAGE_SIZE);
    let (p, len) = (mem.as_mut_ptr() as *mut u8, mem.len());
    r.add(mem, 0).unwrap();
    // SAFETY: the call is refused before the memory is touched.
    assert_eq!(unsafe { r.add_raw(p, len, 0) }, Err(RegionError::Overlap));
    for _ in 0..7 {
        r.add(arena(8 * PAGE_SIZE), 0).unwrap();
    }
    assert_eq!(r.add(arena(8 * PAGE_SIZE), 0), Err(RegionError::Full));
    r.check();
}

/// Memory already in one node's region is refused on every other node,
/// not only on its own: frees find their node by address, so memory in
/// two nodes (a block of the source, leaked and added again) sent one
/// node's pages to the other (found by a review).
#[test]
fn a_region_overlapping_another_nodes_is_refused() {
    let r = leak(R::new());
    let mem = arena(64 * PAGE_SIZE);
    let (p, len) = (mem.as_mut_ptr() as *mut u8, mem.len());
    r.add(mem, 0).unwrap();
    let free = (r.free_pages_on(0), r.free_pages_on(1));
    for node in 1..MAX_NODES {
        // SAFETY: each call is refused before the memory is touched.
        unsafe {
            assert_eq!(r.add_raw(p, len, node), Err(RegionError::Overlap), "the whole region, node {node}");
            assert_eq!(r.add_raw(p.add(16 * PAGE_SIZE), 8 * PAGE_SIZE, node), Err(RegionError::Overlap), "inside it");
            assert_eq!(
                r.add_raw(p.wrapping_sub(PAGE_SIZE), 2 * PAGE_SIZE, node),
                Err(RegionError::Overlap),
                "its start"
            );
        }
    }
    assert_eq!((r.free_pages_on(0), r.free_pages_on(1)), free, "a refused add changed a node");
    r.add(arena(16 * PAGE_SIZE), 1).unwrap();
    r.check();
}

/// `len` bytes of leaked memory starting `skew` bytes past a 1 MiB
/// boundary.
fn placed(len: usize, skew: usize) -> *mut u8 {
    let mem = arena(len + skew + (1 << 20)).as_mut_ptr().cast::<u8>();
    mem.map_addr(|a| a.next_multiple_of(1 << 20) + skew)
}

/// Where a region's page metadata goes: a small page-aligned region keeps
/// every page (and its largest block), an unaligned one uses its partial
/// pages, a large aligned one gives a page.
#[test]
fn region_metadata_costs_small_regions_no_page() {
    let r = leak(R::new());
    // 16 pages, aligned: the metadata is inline, the region one block.
    // SAFETY: leaked memory, used by nothing else.
    unsafe { r.add_raw(placed(16 * PAGE_SIZE, 0), 16 * PAGE_SIZE, 0) }.unwrap();
    assert_eq!(r.stats().pages_reserved, 16);
    let run = r.alloc_pages(4, 0).expect("one 16-page block");
    // SAFETY: the run just allocated.
    unsafe { r.free_pages(run.addr, run.order) };
    // 8 pages and 100 bytes before them: the metadata in those bytes.
    // SAFETY: as above.
    unsafe { r.add_raw(placed(8 * PAGE_SIZE + 100, PAGE_SIZE - 100), 8 * PAGE_SIZE + 100, 1) }.unwrap();
    assert_eq!(r.stats().pages_reserved, 24);
    // 1 MiB, aligned: over the inline room; a meta page.
    // SAFETY: as above.
    unsafe { r.add_raw(placed(1 << 20, 0), 1 << 20, 2) }.unwrap();
    assert_eq!(r.stats().pages_reserved, 24 + 255);
    // The inline room is per node: node 0 has 48 bytes left, so a 64-page
    // region there gives a page, and one on node 3 none.
    // SAFETY: as above.
    unsafe { r.add_raw(placed(64 * PAGE_SIZE, 0), 64 * PAGE_SIZE, 0) }.unwrap();
    assert_eq!(r.stats().pages_reserved, 24 + 255 + 63);
    // SAFETY: as above.
    unsafe { r.add_raw(placed(64 * PAGE_SIZE, 0), 64 * PAGE_SIZE, 3) }.unwrap();
    assert_eq!(r.stats().pages_reserved, 24 + 255 + 63 + 64);
    let mut runs = [0; MAX_ORDER as usize];
    assert!(r.free_runs(&mut runs));
    assert_eq!(runs.iter().enumerate().map(|(k, n)| n << k).sum::<usize>(), r.stats().pages_reserved);
    // Node 3's 64 pages are one block; node 2's meta page at its start
    // leaves it blocks of 1, 2, ..., 128 pages.
    assert_eq!((runs[6], runs[7], runs[8]), (2, 1, 0));
    r.check();
}

/// The first region must give `FIRST_REGION_PAGES` pages, later ones one;
/// the error names the shortest length accepted at the same address.
#[test]
fn too_small_names_the_length_needed() {
    let r = leak(R::new());
    let p = placed(PAGE_SIZE, 0);
    // SAFETY: leaked memory; refused before it is touched.
    let e = unsafe { r.add_raw(p, PAGE_SIZE, 0) };
    assert_eq!(e, Err(RegionError::TooSmall { min_len: FIRST_REGION_PAGES * PAGE_SIZE }));
    let p = placed(3 * PAGE_SIZE, 10);
    // SAFETY: as above.
    let Err(RegionError::TooSmall { min_len }) = (unsafe { r.add_raw(p, 2 * PAGE_SIZE, 0) }) else { panic!() };
    assert_eq!(min_len, PAGE_SIZE - 10 + 2 * PAGE_SIZE);
    // SAFETY: as above; `min_len` bytes lie inside the leaked buffer.
    unsafe { r.add_raw(p, min_len, 0) }.unwrap();
    assert_eq!(r.stats().pages_reserved, 2);
    // SAFETY: as above.
    unsafe { r.add_raw(placed(PAGE_SIZE, 0), PAGE_SIZE, 1) }.unwrap();
    // SAFETY: as above.
    assert!(matches!(unsafe { r.add_raw(placed(PAGE_SIZE, 0), PAGE_SIZE - 1, 1) }, Err(RegionError::TooSmall { .. })));
    assert_eq!(r.stats().pages_reserved, 3);
    r.check();
}

#[test]
fn region_exhausts_cleanly_and_refills() {
    let r = leak(R::new());
    r.add(arena(33 * PAGE_SIZE + 100), 1).unwrap();
    let mut runs = Vec::new();
    while let Some(run) = r.alloc_pages(0, 1) {
        assert_eq!(run.node, 1);
        runs.push(run);
    }
    assert!(runs.len() >= 30, "{}", runs.len());
    assert_eq!(r.alloc_pages(0, 0), None);
    assert_eq!(r.alloc_pages(MAX_ORDER, 0), None);
    assert_eq!(r.stats().pages_in_use, runs.len());
    for run in runs {
        // SAFETY: each run came from `r` and is freed once.
        unsafe { r.free_pages(run.addr, run.order) };
    }
    assert_eq!(r.stats().pages_in_use, 0);
    r.check();
}

/// A free block remembers its zone's index as a hint; a zone added
/// below it moves its zone up the array, and the hint then names another
/// zone: the allocation that takes the block must find its real zone.
#[test]
fn a_free_blocks_zone_hint_survives_a_zone_added_below() {
    let (a, b) = (arena(64 * PAGE_SIZE), arena(64 * PAGE_SIZE));
    let (low, high) = if (a.as_ptr() as usize) < (b.as_ptr() as usize) { (a, b) } else { (b, a) };
    let high_range = high.as_ptr_range();
    let r = leak(R::new());
    r.add(high, 0).unwrap();
    // Every free block of the high zone now carries hint 0.
    let run = r.alloc_pages(2, 0).unwrap();
    // SAFETY: from `r`, freed once.
    unsafe { r.free_pages(run.addr, run.order) };
    r.add(low, 0).unwrap();
    r.check();
    let mut runs = Vec::new();
    while let Some(run) = r.alloc_pages(2, 0) {
        runs.push(run);
    }
    assert!(
        runs.iter().any(|run| high_range.contains(&(run.addr.as_ptr() as *const _))),
        "no run came from the high zone"
    );
    r.check();
    for run in runs {
        // SAFETY: each run came from `r` and is freed once.
        unsafe { r.free_pages(run.addr, run.order) };
    }
    assert_eq!(r.stats().pages_in_use, 0);
    r.check();
}

#[test]
fn adjacent_regions_merge() {
    let r = leak(R::new());
    // Two regions meeting at base + 1.5 MiB: the order-8 (1 MiB) block
    // [base + 1 MiB, base + 2 MiB) exists only if they merged across the
    // seam (the low region keeps its meta page at its start, the high one
    // at its end, away from the seam).
    let mem = arena(6 << 20).as_mut_ptr().cast::<u8>();
    let base = mem.map_addr(|a| a.next_multiple_of(2 << 20));
    let half = 3 << 19;
    // SAFETY: both ranges lie inside the leaked buffer, disjoint.
    unsafe {
        r.add_raw(base, half, 0).unwrap();
        r.add_raw(base.add(half), half, 0).unwrap();
    }
    let base = base.addr();
    r.check();
    let run = r.alloc_pages(8, 0).expect("merged regions yield an order-8 run");
    assert_eq!(run.addr.as_ptr() as usize, base + (1 << 20));
    assert_eq!(r.alloc_pages(8, 0), None);
    // SAFETY: from `r`, freed once.
    unsafe { r.free_pages(run.addr, run.order) };
    r.check();
}

/// Random alloc/free/grow against a shadow map: alignment, no overlap,
/// content. Runs grow in place by `claim_pages` and are freed piecewise.
fn buddy_model<S: PageSource>(src: &S, ops: usize, max_order: u32, seed: u64) {
    let mut rng = Rng::new(seed);
    // Keyed by address: (pages, tag, pointer with its provenance).
    let mut live: BTreeMap<usize, (usize, u8, *mut u8)> = BTreeMap::new();
    let overlaps = |live: &BTreeMap<usize, (usize, u8, *mut u8)>, a: usize, len: usize| {
        live.range(..a + len).next_back().is_some_and(|(&b, &(pages, _, _))| b + pages * PAGE_SIZE > a)
    };
    // Under Miri, check a sample of each run: its byte loop is slow.
    let step = if cfg!(miri) { 509 } else { 1 };
    let (mut grown, mut refused) = (0, 0);
    for i in 0..ops {
        let tag = (i % 251) as u8;
        let roll = rng.below(100);
        if live.is_empty() || roll < 50 {
            let order = rng.below(max_order as usize + 1) as u32;
            if let Some(run) = src.alloc_pages(order, rng.below(2)) {
                let a = run.addr.as_ptr().addr();
                let len = PAGE_SIZE << order;
                assert_eq!(a % len, 0, "misaligned run");
                assert!(!overlaps(&live, a, len), "overlap");
                // SAFETY: a fresh run of `len` bytes.
                unsafe { core::ptr::write_bytes(run.addr.as_ptr(), tag, len) };
                live.insert(a, (1 << order, tag, run.addr.as_ptr()));
            }
        } else if roll < 65 {
            let k = *live.keys().nth(rng.below(live.len())).unwrap();
            let (pages, t, p) = live[&k];
            let extra = 1 + rng.below(8);
            let end = p.wrapping_add(pages * PAGE_SIZE);
            if src.claim_pages(core::ptr::NonNull::new(end).unwrap(), extra) {
                grown += 1;
                live.remove(&k);
                assert!(!overlaps(&live, end.addr(), extra * PAGE_SIZE), "claimed pages in use");
                // SAFETY: the claimed pages are ours now.
                unsafe { core::ptr::write_bytes(end, t, extra * PAGE_SIZE) };
                live.insert(k, (pages + extra, t, p));
            } else {
                refused += 1;
            }
        } else {
            let k = *live.keys().nth(rng.below(live.len())).unwrap();
            let (pages, tag, p) = live.remove(&k).unwrap();
            // SAFETY: live run of `pages` pages.
            let s = unsafe { core::slice::from_raw_parts(p, pages * PAGE_SIZE) };
            assert!(s.iter().step_by(step).all(|&b| b == tag), "run content clobbered");
            // SAFETY: from `src`, freed once, in naturally aligned pieces.
            for_each_block(p, pages, |q, o| unsafe { src.free_pages(core::ptr::NonNull::new(q).unwrap(), o) });
        }
    }
    for (_, (pages, _, p)) in live {
        // SAFETY: from `src`, freed once, in naturally aligned pieces.
        for_each_block(p, pages, |q, o| unsafe { src.free_pages(core::ptr::NonNull::new(q).unwrap(), o) });
    }
    assert_eq!(src.stats().pages_in_use, 0);
    assert!(grown > 0 && refused > 0, "grown {grown}, refused {refused}");
}

#[test]
fn region_model() {
    let r = leak(R::new());
    r.add(arena(3 << 20), 0).unwrap();
    r.add(arena(1 << 20), 1).unwrap();
    buddy_model(r, scaled(20_000, 100), 6, 1);
    r.check();
    let free: usize = (0..MAX_NODES).map(|n| r.free_pages_on(n)).sum();
    assert_eq!(free, r.stats().pages_reserved, "pages lost");
}

#[cfg(feature = "std")]
#[test]
fn os_pages_model_and_release() {
    let os = leak(OsPages::<DefaultRawMutex>::new());
    buddy_model(os, scaled(5_000, 100), 11, 2);
    os.check();
    // Everything is free; freed chunks stay mapped until a trim, which
    // keeps one spare chunk.
    assert!(os.stats().pages_reserved > 1024, "{:?}", os.stats());
    assert!(os.trim() > 0);
    assert!(os.stats().pages_reserved <= 1024, "{:?}", os.stats());
    assert_eq!(os.ownership(0x1000), Ownership::Foreign);
}

/// `OsPages` keeps each node's runs in chunks of that node (on this
/// one-node machine the binds are skipped; the chunks are told apart all
/// the same): runs for nodes 0 and 1 never share a chunk, a run freed on
/// node 1 comes back for node 1 and not for node 0, and runs are tagged
/// with their node.
#[cfg(feature = "std")]
#[test]
fn os_pages_runs_come_from_their_nodes_chunks() {
    const CHUNK: usize = 4 << 20;
    let os = leak(OsPages::<DefaultRawMutex>::new());
    let chunk = |r: &PageRun| r.addr.as_ptr().addr() / CHUNK;
    let mut runs: [Vec<PageRun>; 2] = [Vec::new(), Vec::new()];
    for i in 0..scaled(600, 10) {
        let node = i % 2;
        let run = os.alloc_pages((i % 4) as u32, node).unwrap();
        assert_eq!(run.node, node);
        runs[node].push(run);
    }
    for a in &runs[0] {
        assert!(runs[1].iter().all(|b| chunk(a) != chunk(b)), "nodes 0 and 1 share a chunk");
    }
    os.check();
    // A node-1 block freed, then asked for by node 0 then node 1: node 0
    // gets its own chunks' pages, node 1 its block back.
    let freed = runs[1].pop().unwrap();
    // SAFETY: a live run of `os`, freed once.
    unsafe { os.free_pages(freed.addr, freed.order) };
    let zero = os.alloc_pages(freed.order, 0).unwrap();
    assert!(runs[1].iter().all(|b| chunk(b) != chunk(&zero)));
    let one = os.alloc_pages(freed.order, 1).unwrap();
    assert_eq!(one.addr, freed.addr);
    runs[0].push(zero);
    runs[1].push(one);
    // Nodes beyond MAX_NODES fold onto the last one.
    let last = os.alloc_pages(0, MAX_NODES + 3).unwrap();
    assert_eq!(last.node, MAX_NODES - 1);
    runs[1].push(last);
    for r in runs.iter().flatten() {
        // SAFETY: live runs of `os`, freed once.
        unsafe { os.free_pages(r.addr, r.order) };
    }
    os.check();
    assert_eq!(os.stats().pages_in_use, 0);
}

/// Bulk frees: runs of one order given back in batches (pooled orders and,
/// on `OsPages`, direct mappings above a chunk) leave nothing in use, and
/// the memory comes back for the next round with every run disjoint.
fn bulk_free_round_trip<S: PageSource>(src: &S, orders: &[u32]) {
    for &order in orders {
        for _round in 0..3 {
            let runs: Vec<NonNull<u8>> =
                (0..scaled(20, 5)).map_while(|_| src.alloc_pages(order, 0)).map(|r| r.addr).collect();
            assert!(!runs.is_empty());
            let mut starts: Vec<usize> = runs.iter().map(|r| r.as_ptr() as usize).collect();
            starts.sort();
            assert!(starts.windows(2).all(|w| w[1] - w[0] >= PAGE_SIZE << order), "overlapping runs");
            for &r in &runs {
                // SAFETY: a fresh run of `2^order` pages of ours.
                unsafe { r.as_ptr().write_bytes(0xa5, PAGE_SIZE << order) };
            }
            // SAFETY: distinct live runs of this order, given back once.
            unsafe { src.free_pages_bulk(&runs, order) };
            assert_eq!(src.stats().pages_in_use, 0, "order {order}");
        }
    }
}

#[test]
fn region_bulk_free() {
    let r = leak(R::new());
    r.add(arena(256 * PAGE_SIZE), 0).unwrap();
    bulk_free_round_trip(r, &[0, 1, 3]);
    r.check();
}

#[cfg(feature = "std")]
#[test]
fn os_pages_bulk_free() {
    let os = leak(OsPages::<DefaultRawMutex>::new());
    bulk_free_round_trip(os, &[0, 2, 9, 10]);
    assert_eq!(os.ownership(0x1000), Ownership::Foreign);
}

/// The page map of `OsPages` on made-up addresses (it never touches the
/// pages it tracks): ranges across bitmap words and a leaf seam, partial
/// clears, and addresses beyond the space it covers.
#[cfg(feature = "std")]
#[test]
fn page_map_marks_and_clears_pages() {
    use super::os::PageMap;
    let m = leak(PageMap::new());
    let seam = 5 * PageMap::LEAF_SPAN;
    let (lo, hi) = (seam - 70 * PAGE_SIZE, seam + 70 * PAGE_SIZE);
    assert!(!m.contains(lo) && !m.contains(seam));
    assert!(m.mark(lo, hi - lo));
    assert!(!m.contains(lo - 1) && !m.contains(hi));
    for a in (lo..hi).step_by(PAGE_SIZE) {
        assert!(m.contains(a) && m.contains(a + PAGE_SIZE - 1), "{a:#x}");
    }
    // Clear a piece across the seam and one inside a word: the rest stays.
    m.clear(seam - 3 * PAGE_SIZE, 6 * PAGE_SIZE);
    m.clear(lo + PAGE_SIZE, PAGE_SIZE);
    for a in (lo..hi).step_by(PAGE_SIZE) {
        let cleared = a == lo + PAGE_SIZE || (seam - 3 * PAGE_SIZE..seam + 3 * PAGE_SIZE).contains(&a);
        assert_eq!(m.contains(a), !cleared, "{a:#x}");
    }
    m.clear(lo, hi - lo);
    assert!((lo..hi).step_by(PAGE_SIZE).all(|a| !m.contains(a)));
    // Clearing where no leaf was ever mapped is a no-op.
    m.clear(PAGE_SIZE, 3 * PageMap::LEAF_SPAN);
    // Beyond the covered space: never set, and marking is refused.
    let top = if usize::BITS >= 64 { 1usize << 48 } else { 0 };
    if top != 0 {
        assert!(!m.mark(top, PAGE_SIZE));
        assert!(!m.mark(top - PAGE_SIZE, 2 * PAGE_SIZE));
        assert!(!m.contains(top) && !m.contains(usize::MAX));
    }
    assert!(!m.mark(usize::MAX & !(PAGE_SIZE - 1), PAGE_SIZE));
    assert!(!m.contains(usize::MAX) && !m.contains(0));
}

/// Threads setting and clearing interleaved pages of the same bitmap words
/// never disturb each other's bits.
#[cfg(feature = "std")]
#[test]
fn page_map_neighbours_in_a_word_are_independent() {
    use super::os::PageMap;
    const T: usize = 4;
    let m = leak(PageMap::new());
    let base = 7 * PageMap::LEAF_SPAN;
    let rounds = scaled(2000, 100);
    std::thread::scope(|s| {
        for t in 0..T {
            s.spawn(move || {
                for r in 0..rounds {
                    // Pages t, t + T, t + 2T, ... of two words: ours alone.
                    let page = t + T * (r % (128 / T));
                    let a = base + page * PAGE_SIZE;
                    assert!(m.mark(a, PAGE_SIZE));
                    assert!(m.contains(a));
                    m.clear(a, PAGE_SIZE);
                    assert!(!m.contains(a));
                }
                assert!(m.mark(base + t * PAGE_SIZE, PAGE_SIZE));
            });
        }
    });
    for page in 0..128 {
        assert_eq!(m.contains(base + page * PAGE_SIZE), page < T, "page {page}");
    }
}

/// `OsPages::ownership`: pooled runs, direct runs (above a chunk, and
/// small ones once the pool is full), freed pieces of direct runs, and
/// addresses the source never mapped.
#[cfg(feature = "std")]
#[test]
fn os_pages_ownership_of_pooled_direct_and_foreign_pages() {
    const CHUNK: usize = 1024 * PAGE_SIZE;
    let os = leak(OsPages::<DefaultRawMutex>::with_max_chunks(1));
    let owned = |a: usize| os.ownership(a) == Ownership::Owned;
    // Whether the first, middle and last byte of `r` are owned.
    let probe = |r: &PageRun| {
        let (a, len) = (r.addr.as_ptr().addr(), PAGE_SIZE << r.order);
        [owned(a), owned(a + len / 2), owned(a + len - 1)]
    };
    let run_owned = |r: &PageRun| probe(r) == [true; 3];
    let run_foreign = |r: &PageRun| probe(r) == [false; 3];
    // The pool's one chunk: a page, then its one order-9 block.
    let page = os.alloc_pages(0, 0).unwrap();
    let half = os.alloc_pages(9, 0).unwrap();
    let chunk = page.addr.as_ptr().addr() & !(CHUNK - 1);
    assert_eq!(half.addr.as_ptr().addr() & !(CHUNK - 1), chunk, "both from the chunk");
    assert!(run_owned(&page) && run_owned(&half));
    assert!(owned(chunk), "the chunk's metadata page is the source's too");
    // The pool is full: the next order-9 run is a direct mapping, as is
    // every run above a chunk.
    let small = os.alloc_pages(9, 0).unwrap();
    let big = os.alloc_pages(11, 0).unwrap();
    for r in [&small, &big] {
        assert_ne!(r.addr.as_ptr().addr() & !(CHUNK - 1), chunk, "a direct mapping");
        assert!(run_owned(r));
    }
    // Addresses it never mapped: another source's pages, the heap, the
    // stack, and the ends of the address space.
    let other = leak(OsPages::<DefaultRawMutex>::new());
    let theirs = other.alloc_pages(0, 0).unwrap();
    let heap = std::vec![0u8; 64];
    let stack = 0u64;
    for a in
        [theirs.addr.as_ptr().addr(), heap.as_ptr().addr(), core::ptr::addr_of!(stack).addr(), 0, PAGE_SIZE, usize::MAX]
    {
        assert_eq!(os.ownership(a), Ownership::Foreign, "{a:#x}");
    }
    // Freed pieces of direct runs are no longer the source's; the rest is.
    let b = big.addr.as_ptr();
    // SAFETY: the upper half of `big`, a naturally aligned piece, freed once.
    unsafe { os.free_pages(NonNull::new(b.wrapping_add(PAGE_SIZE << 10)).unwrap(), 10) };
    assert!(owned(b.addr()) && owned(b.addr() + (PAGE_SIZE << 10) - 1));
    assert!(!owned(b.addr() + (PAGE_SIZE << 10)) && !owned(b.addr() + (PAGE_SIZE << 11) - 1));
    // SAFETY: each a live run (or the live half of one) of `os`, freed once.
    unsafe {
        os.free_pages(big.addr, 10);
        os.free_pages(small.addr, 9);
        os.free_pages(half.addr, 9);
        os.free_pages(page.addr, 0);
        other.free_pages(theirs.addr, 0);
    }
    assert!(run_foreign(&big) && run_foreign(&small));
    // Pooled pages stay the source's while their chunk stays mapped.
    assert!(run_owned(&page) && run_owned(&half));
    assert_eq!(os.stats().pages_in_use, 0);
    assert_eq!(os.stats().pages_reserved, 1024, "only the chunk stays mapped");
}

/// The default lock with `std` excludes: more threads than CPUs add to one
/// plain counter under it, past the spin into the yielding wait (holds are
/// long enough to be preempted in), and no increment is lost.
#[cfg(feature = "std")]
#[test]
fn yielding_lock_excludes_under_oversubscription() {
    let m: lock_api::Mutex<DefaultRawMutex, usize> = lock_api::Mutex::new(0);
    let per = scaled(20_000, 50);
    let threads = if cfg!(miri) { 3 } else { 16 };
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..per {
                    let mut g = m.lock();
                    let v = *g;
                    // A read-modify-write spread over a hold, so a second
                    // holder would lose updates.
                    for _ in 0..8 {
                        core::hint::spin_loop();
                    }
                    *g = v + 1;
                }
            });
        }
    });
    assert_eq!(*m.lock(), threads * per);
    assert!(m.try_lock().is_some(), "the lock stays free after its last holder");
}

/// The default lock against a hostile user: `try_lock` fails while a
/// guard lives, a forgotten guard keeps it locked (as any mutex) until
/// `force_unlock`, and a waiter that spun past the yield threshold still
/// gets the lock once its holder lets go.
#[cfg(feature = "std")]
#[test]
fn yielding_lock_try_lock_forgotten_guards_and_long_waits() {
    let m: lock_api::Mutex<DefaultRawMutex, u32> = lock_api::Mutex::new(0);
    let g = m.lock();
    assert!(m.is_locked());
    std::thread::scope(|s| {
        s.spawn(|| assert!(m.try_lock().is_none(), "try_lock while held"));
    });
    core::mem::forget(g);
    assert!(m.is_locked() && m.try_lock().is_none(), "a forgotten guard unlocked");
    // SAFETY: the forgotten guard's hold is ours, and nothing else holds it.
    unsafe { m.force_unlock() };
    *m.try_lock().expect("free again") += 1;
    // A waiter that outlasts the spin and yields until the holder is done.
    let held = m.lock();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| *m.lock() += 1);
        std::thread::sleep(std::time::Duration::from_millis(if cfg!(miri) { 1 } else { 20 }));
        assert!(!waiter.is_finished(), "the waiter got a held lock");
        drop(held);
        waiter.join().unwrap();
    });
    assert_eq!(*m.lock(), 2);
}

/// The child of a `fork` keeps no published word of a thread it does not
/// have: its revoker would otherwise write into that thread's dead
/// memory (`revoke`'s *After fork*).
#[cfg(all(feature = "std", not(loom), not(miri)))]
#[test]
fn fork_child_follows_no_dead_threads_word() {
    use core::alloc::{GlobalAlloc, Layout};
    use std::sync::{Arc, Barrier};

    let k: &'static crate::Kmem<OsPages> = leak(crate::Kmem::new(OsPages::new()));
    let l = Layout::new::<[u64; 4]>();
    let published = || (0..MAX_CPUS).filter(|&s| !threads::published(s).is_null()).count();
    // A thread that holds a slot (and so, with membarrier, publishes its
    // word) while the fork happens.
    let (holding, done) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let t = {
        let (holding, done) = (holding.clone(), done.clone());
        std::thread::spawn(move || {
            // SAFETY: a valid layout; freed with it.
            unsafe { k.dealloc(k.alloc(l), l) };
            holding.wait();
            done.wait();
        })
    };
    holding.wait();
    // SAFETY: as above.
    unsafe { k.dealloc(k.alloc(l), l) };
    // At least one of these two threads' words (other tests' threads come and
    // go meanwhile, so no count from before is compared: that flaked).
    assert!(published() >= 1, "the threads published their words (membarrier is available here)");
    // SAFETY: the child only loads atomics and calls `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // The child: only this thread exists; at most its own word stays.
        let left = published();
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(if left <= 1 { 0 } else { 10 + left as i32 }) };
    }
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    // SAFETY: `pid` is our child; `status` a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "the child kept words of threads it does not have");
    done.wait();
    t.join().unwrap();
}

/// `Rseq`'s lock words: a hold sets its CPU's `HELD` and `exit` clears
/// it; a steal of a held slot waits (with `want` raised) until the hold
/// ends; while every slot is stolen no hold is granted.
#[cfg(all(feature = "std", not(loom), not(miri)))]
#[test]
fn rseq_lock_words_follow_holds_and_steals() {
    use crate::sync::{AtomicBool, Ordering};
    let p = Rseq::new();
    if !p.per_cpu() {
        // The fallback is `Threads`, tested on its own.
        return;
    }
    assert!(p.slots_are_locks() && p.asymmetric());
    // SAFETY: this thread holds no slot of `p` (nothing else in this
    // test binary uses `Rseq`).
    let s = unsafe { p.enter() }.expect("a CPU slot");
    assert_eq!(rseq::lock_state(s), 1);
    let stolen = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            // SAFETY: a drain's steal, given back at once.
            assert!(unsafe { p.steal(s) });
            stolen.store(true, Ordering::SeqCst);
            // SAFETY: stolen just above.
            unsafe { p.unsteal(s) };
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!stolen.load(Ordering::SeqCst), "a held slot was stolen");
        assert_eq!(rseq::lock_want(s), 1, "the waiting drainer raised want");
        // SAFETY: entered above.
        unsafe { p.exit(s) };
    });
    assert!(stolen.into_inner());
    assert_eq!((rseq::lock_state(s), rseq::lock_want(s)), (0, 0));
    for slot in 0..MAX_CPUS {
        // SAFETY: nobody holds a slot; given back below.
        assert!(unsafe { p.steal(slot) }, "free slot {slot} not stolen");
        assert_eq!(rseq::lock_state(slot), 2);
    }
    // SAFETY: this thread holds no slot.
    assert_eq!(unsafe { p.try_enter() }, None);
    // SAFETY: as above.
    assert_eq!(unsafe { p.enter() }, None);
    for slot in 0..MAX_CPUS {
        // SAFETY: stolen above.
        unsafe { p.unsteal(slot) };
        assert_eq!(rseq::lock_state(slot), 0);
    }
    p.heavy_barrier();
}

/// `Threads`' fast-path word (`revoke`): an armed word is its slot times
/// 32 and holds it; a counting word holds its slot while ticks last,
/// counting one down per hold; `NONE` holds nothing.
#[cfg(feature = "std")]
#[test]
fn fast_words_hold_their_slots() {
    use crate::sync::{AtomicUsize, Ordering};
    use revoke::{FAST_TICKS, NONE, armed, counting, fast_hold};
    for slot in 0..MAX_CPUS {
        assert_eq!(armed(slot), slot * 32);
        let word = AtomicUsize::new(armed(slot));
        assert_eq!(fast_hold(&word), Some(slot));
        assert_eq!(word.load(Ordering::Relaxed), armed(slot), "an armed hold stores nothing");
        let word = AtomicUsize::new(counting(slot, 2));
        assert_eq!(fast_hold(&word), Some(slot));
        assert_eq!(word.load(Ordering::Relaxed), counting(slot, 1));
        assert_eq!(fast_hold(&word), Some(slot));
        assert_eq!(word.load(Ordering::Relaxed), counting(slot, 0));
        assert_eq!(fast_hold(&word), None, "out of ticks");
        let word = AtomicUsize::new(counting(slot, FAST_TICKS));
        assert_eq!(fast_hold(&word), Some(slot));
    }
    assert_eq!(fast_hold(&AtomicUsize::new(NONE)), None);
}

/// A review's finding: the cross-node overlap check compares a new range
/// with each span's handed-in start and its *usable* end, but a region
/// handed in with room after its last whole page keeps its page metadata
/// there (`MetaAt::Bytes(hi)`), past that end. Another node's region
/// starting in those bytes is not refused: its buddy writes its free-list
/// links over the first region's metadata. (The same node's buddy compares
/// raw ranges, metadata included, and refuses it.)
#[test]
fn a_region_over_another_nodes_tail_metadata_is_refused() {
    let r = leak(R::new());
    let p = placed(16 * PAGE_SIZE, 0);
    // Region A, node 0: 4 whole pages and 4 bytes after them, where its
    // 4 meta bytes go.
    // SAFETY: leaked memory, used by nothing else.
    unsafe { r.add_raw(p, 4 * PAGE_SIZE + 4, 0) }.unwrap();
    r.check();
    // Region B, node 1, from A's usable end: its first 4 bytes are A's
    // metadata (the caller broke `add_raw`'s contract; `Overlap` is the
    // documented answer, as for every other overlap).
    // SAFETY: inside the leaked buffer; refused (or not) before use.
    let res = unsafe { r.add_raw(p.wrapping_add(4 * PAGE_SIZE), 8 * PAGE_SIZE, 1) };
    if res.is_ok() {
        let broken = std::panic::catch_unwind(|| r.check()).is_err();
        panic!(
            "node 1 accepted a region over node 0's page metadata (A's bytes {:#x}..+4); \
             node 0's buddy invariants broken afterwards: {broken}",
            p.addr() + 4 * PAGE_SIZE
        );
    }
    assert_eq!(res, Err(RegionError::Overlap));
}
