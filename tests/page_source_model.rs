//! A model-based test of the page layer's safe interface: random
//! programs of `Region::add` (slices of any length and offset, on any node
//! number), `alloc_pages` (any order, any node), frees (whole, or in two
//! halves), `claim_pages` (at a live run's end, at any page near the
//! memory, and off a page boundary, which must be refused) and
//! `free_runs`/`ownership`, against a shadow list of the live runs: every
//! run is aligned to its size, inside the memory handed in, overlaps no
//! live run and keeps the bytes written to it; pages in use and free add
//! up to the pages reserved after every check. Written by a review that
//! looked for safe page-source calls corrupting state (after one found
//! `claim_pages` taking an address off a page: `tests/claim_pages.rs`).

#[path = "support/rng.rs"]
mod rng;

use std::mem::MaybeUninit;
use std::ptr::NonNull;

use kmemcg::{DefaultRawMutex, MAX_NODES, MAX_ORDER, PAGE_SIZE, PageSource, Region};
use rng::Rng;

/// `bytes` of leaked memory starting `skew` bytes past a 64 KiB boundary.
fn leaked(bytes: usize, skew: usize) -> &'static mut [MaybeUninit<u8>] {
    let v: &'static mut [MaybeUninit<u8>] =
        Box::leak(vec![MaybeUninit::uninit(); bytes + skew + (1 << 16)].into_boxed_slice());
    let at = v.as_ptr().align_offset(1 << 16) + skew;
    &mut v[at..at + bytes]
}

/// Random regions, runs, claims, frees; checks alignment, bounds, overlap, contents, counters.
fn fuzz_region<const Z: usize>(seed: u64) {
    let mut rng = Rng(seed);
    let r: &'static Region<DefaultRawMutex, Z> = Box::leak(Box::new(Region::new()));
    let mut slices: Vec<(usize, usize, usize)> = Vec::new();
    for _ in 0..(Z + 4) {
        let len = match rng.below(4) {
            0 => rng.below(3 * PAGE_SIZE as u64) as usize,
            1 => rng.below(40 * PAGE_SIZE as u64) as usize,
            2 => (rng.below(70) as usize) * PAGE_SIZE + rng.below(3) as usize,
            _ => rng.below(300 * PAGE_SIZE as u64) as usize,
        };
        let skew = if rng.below(2) == 0 { 0 } else { rng.below(PAGE_SIZE as u64) as usize };
        let node = rng.below(MAX_NODES as u64 + 2) as usize;
        let m = leaked(len, skew);
        let (lo, hi) = (m.as_ptr().addr(), m.as_ptr().addr() + m.len());
        match r.add(m, node) {
            Ok(()) => {
                slices.push((lo, hi, node));
            }
            Err(e) => assert!(node < MAX_NODES || e == kmemcg::RegionError::BadNode, "{e:?}"),
        }
    }
    let reserved = r.stats().pages_reserved;
    let mut live: Vec<(usize, u32, u8)> = Vec::new(); // (addr, order, tag); pieces of order
    let mut in_use = 0usize;
    let check_run = |a: usize, order: u32, live: &Vec<(usize, u32, u8)>| {
        let len = PAGE_SIZE << order;
        assert_eq!(a % len, 0, "run {a:#x} of order {order} misaligned");
        assert!(
            slices.iter().any(|&(lo, hi, _)| a >= lo && a + len <= hi) || {
                // may straddle a seam of adjacent slices: check page by page
                (0..1usize << order)
                    .all(|p| slices.iter().any(|&(lo, hi, _)| a + p * PAGE_SIZE >= lo && a + (p + 1) * PAGE_SIZE <= hi))
            },
            "run {a:#x} order {order} outside the memory handed in"
        );
        for &(b, o, _) in live {
            let bl = PAGE_SIZE << o;
            assert!(a + len <= b || b + bl <= a, "run {a:#x}/{order} overlaps live {b:#x}/{o}");
        }
    };
    for step in 0..4000u32 {
        match rng.below(10) {
            0..=3 => {
                let order = rng.below(8) as u32;
                let node = rng.below(MAX_NODES as u64 + 3) as usize;
                if let Some(run) = r.alloc_pages(order, node) {
                    assert!(run.node < MAX_NODES);
                    assert_eq!(run.order, order);
                    let a = run.addr.as_ptr().addr();
                    check_run(a, order, &live);
                    let tag = (step % 251) as u8 + 1;
                    // SAFETY: the run is ours, `PAGE_SIZE << order` bytes.
                    unsafe { run.addr.as_ptr().write_bytes(tag, PAGE_SIZE << order) };
                    live.push((a, order, tag));
                    in_use += 1 << order;
                }
            }
            4..=5 if !live.is_empty() => {
                let i = rng.below(live.len() as u64) as usize;
                let (a, o, tag) = live.swap_remove(i);
                let p = a as *mut u8;
                for off in (0..PAGE_SIZE << o).step_by(512) {
                    // SAFETY: inside the live run.
                    assert_eq!(unsafe { *p.add(off) }, tag, "run {a:#x}/{o} corrupted at {off}");
                }
                // Sometimes freed in two halves, as a source takes runs back.
                if o > 0 && rng.below(2) == 0 {
                    // SAFETY: the live run, freed once, as its two halves.
                    unsafe {
                        r.free_pages(NonNull::new(p).unwrap(), o - 1);
                        r.free_pages(NonNull::new(p.add(PAGE_SIZE << (o - 1))).unwrap(), o - 1);
                    }
                } else {
                    // SAFETY: the live run, freed once with its order.
                    unsafe { r.free_pages(NonNull::new(p).unwrap(), o) };
                }
                in_use -= 1 << o;
            }
            6..=7 => {
                // claim: at the end of a live run, or anywhere page aligned in/near a slice
                let at = if !live.is_empty() && rng.below(2) == 0 {
                    let (a, o, _) = live[rng.below(live.len() as u64) as usize];
                    a + (PAGE_SIZE << o)
                } else if !slices.is_empty() {
                    let (lo, hi, _) = slices[rng.below(slices.len() as u64) as usize];
                    let a = lo + rng.below((hi - lo + 2 * PAGE_SIZE) as u64) as usize;
                    (a & !(PAGE_SIZE - 1)).max(PAGE_SIZE)
                } else {
                    continue;
                };
                let pages = match rng.below(4) {
                    0 => usize::MAX,
                    1 => usize::MAX / PAGE_SIZE,
                    2 => 1 + rng.below(3) as usize,
                    _ => 1 + rng.below(64) as usize,
                };
                // The same address off its page must be refused and change
                // nothing (the buddy rounded it down once).
                let off = 1 + rng.below(PAGE_SIZE as u64 - 1) as usize;
                assert!(!r.claim_pages(NonNull::new((at + off) as *mut u8).unwrap(), pages), "claim off a page");
                assert_eq!(r.stats().pages_in_use, in_use, "a refused claim changed the count");
                if r.claim_pages(NonNull::new(at as *mut u8).unwrap(), pages) {
                    // each claimed page becomes an order-0 live run
                    for p in 0..pages {
                        let a = at + p * PAGE_SIZE;
                        check_run(a, 0, &live);
                        let tag = (step % 251) as u8 + 1;
                        // SAFETY: a page the claim gave us.
                        unsafe { (a as *mut u8).write_bytes(tag, PAGE_SIZE) };
                        live.push((a, 0, tag));
                    }
                    in_use += pages;
                }
            }
            _ => {
                let mut out = [0usize; MAX_ORDER as usize];
                assert!(r.free_runs(&mut out));
                let free: usize = out.iter().enumerate().map(|(k, n)| n << k).sum();
                assert_eq!(r.stats().pages_in_use, in_use);
                assert_eq!(free + in_use, reserved, "free {free} + in use {in_use} != reserved {reserved}");
                for a in [0usize, 1, usize::MAX, usize::MAX - PAGE_SIZE + 1] {
                    let _ = r.ownership(a);
                }
                for &(lo, hi, _) in &slices {
                    let _ = (r.ownership(lo.wrapping_sub(1)), r.ownership(hi), r.ownership(hi + PAGE_SIZE));
                }
            }
        }
    }
    for (a, o, tag) in live.drain(..) {
        for off in (0..PAGE_SIZE << o).step_by(512) {
            // SAFETY: inside the live run.
            assert_eq!(unsafe { *(a as *const u8).add(off) }, tag, "run {a:#x}/{o} corrupted at {off}");
        }
        // SAFETY: the live run, freed once with its order.
        unsafe { r.free_pages(NonNull::new(a as *mut u8).unwrap(), o) };
    }
    assert_eq!(r.stats().pages_in_use, 0);
    let mut out = [0usize; MAX_ORDER as usize];
    assert!(r.free_runs(&mut out));
    let free: usize = out.iter().enumerate().map(|(k, n)| n << k).sum();
    assert_eq!(free, reserved);
}

#[test]
fn region_fuzz_z32() {
    for seed in 1..40u64 {
        fuzz_region::<32>(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
}

#[test]
fn region_fuzz_z2() {
    for seed in 1..40u64 {
        fuzz_region::<2>(seed.wrapping_mul(0x1234_5678_9ABC_DEF1));
    }
}
