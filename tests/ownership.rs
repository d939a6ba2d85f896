//! Frees of memory `OsPages` mapped directly are recognised as its own.
//!
//! `Kmem` asks its page source whether it owns every pointer given to a
//! size-class free (debug builds and feature `hardened`). With a pool of
//! two chunks, most slabs of a burst of small objects come from direct
//! mappings once the pool is full; every one of those frees is legitimate
//! and must neither be counted as a bad free (debug) nor abort (hardened),
//! and every page must come back.
//!
//! The workload runs in a child process (this test binary, re-run with an
//! environment variable), so a hardened abort fails the test instead of
//! killing the harness; debug builds also run it in process.

use std::alloc::{GlobalAlloc, Layout};
use std::process::Command;

use kmemcg::{Kmem, OsPages, PAGE_SIZE};

/// Chunks in the pool: 8 MiB, passed many times over by the workload.
const MAX_CHUNKS: usize = 2;
/// Pages in one pooled chunk (4 MiB).
const CHUNK_PAGES: usize = 1024;

/// Object sizes from 64 B to the largest class (16 KiB), then large
/// objects on the page path: a pooled run, and runs above a chunk that are
/// mapped directly (5 MiB: an 8 MiB mapping whose tail goes back at once).
const SMALL: [usize; 10] = [64, 96, 200, 512, 1000, 2048, 3000, 4096, 8192, 16384];
const LARGE: [usize; 4] = [20 << 10, 300 << 10, 1 << 20, 5 << 20];

/// Allocates well past the pool's chunk limit through size classes (and a
/// few large objects), checks every block, frees everything and checks
/// that nothing was a bad free and that every page came back.
fn past_the_pool_limit() {
    let k: &'static Kmem<OsPages> = Box::leak(Box::new(Kmem::new(OsPages::with_max_chunks(MAX_CHUNKS))));
    let root = k.root();
    let (usage0, pages0) = (root.usage(), k.stats().source.pages_in_use);
    let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
    for i in 0..6_000 {
        let size = if i % 500 == 499 { LARGE[(i / 500) % LARGE.len()] } else { SMALL[i % SMALL.len()] };
        let layout = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: a layout of non-zero size.
        let p = unsafe { k.alloc(layout) };
        assert!(!p.is_null(), "allocation {i} of {size} B failed");
        let tag = (i % 251) as u8;
        // SAFETY: a fresh block of `size` bytes: its first and last byte.
        unsafe {
            p.write(tag);
            p.add(size - 1).write(tag);
        }
        live.push((p, layout, tag));
    }
    let reserved = k.stats().source.pages_reserved;
    assert!(
        reserved > 4 * MAX_CHUNKS * CHUNK_PAGES,
        "the workload stayed near the pool ({reserved} pages mapped): it tests nothing"
    );
    // Free in an order unlike the allocation order, so slabs empty late.
    live.sort_by_key(|&(p, _, _)| p.addr().rotate_left(17));
    for (p, layout, tag) in live {
        // SAFETY: a live block of `layout.size()` bytes, freed once below.
        unsafe {
            assert_eq!((p.read(), p.add(layout.size() - 1).read()), (tag, tag), "block clobbered");
            k.dealloc(p, layout);
        }
    }
    assert_eq!(k.stats().bad_frees, 0, "legitimate frees were taken for bad ones");
    k.shrink();
    k.reap();
    let s = k.stats();
    assert_eq!(s.large_objects, 0);
    assert_eq!(root.usage(), usage0, "usage did not come back");
    assert_eq!(s.source.pages_in_use, pages0, "pages leaked");
    // The allocator's own metadata and the one spare chunk stay mapped.
    assert!(s.source.pages_reserved <= 2 * CHUNK_PAGES, "{:?}", s.source);
    // Every page went back, so the pool serves again from its chunks.
    let l = Layout::from_size_align(64, 8).unwrap();
    // SAFETY: a valid layout; the block is freed once.
    unsafe {
        let p = k.alloc(l);
        assert!(!p.is_null());
        k.dealloc(p, l);
    }
    assert_eq!(k.stats().bad_frees, 0);
    println!("past_the_pool_limit: ok, peak {reserved} pages mapped");
}

/// The child's side: runs the workload when asked to.
#[test]
fn run_case() {
    if std::env::var_os("KMEMCG_OWNERSHIP_CHILD").is_some() {
        past_the_pool_limit();
    }
}

/// The workload in a child process: with `--features hardened` a legitimate
/// free taken for a foreign one aborts it.
#[test]
fn frees_past_the_pool_limit_in_a_child() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "run_case", "--nocapture", "--test-threads=1"])
        .env("KMEMCG_OWNERSHIP_CHILD", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed ({}):\n{stdout}\n{stderr}", out.status);
    // The workload really ran (the case filter matched).
    assert!(stdout.contains("past_the_pool_limit: ok"), "{stdout}");
}

/// The workload in process, where a failure reports its own message (a
/// hardened build aborts on the first bad free, so it runs only in the
/// child there).
#[cfg(not(feature = "hardened"))]
#[test]
fn frees_past_the_pool_limit() {
    past_the_pool_limit();
}

/// Large objects on direct mappings are freed cleanly too, and their pages
/// are the source's while they live.
#[test]
fn large_objects_on_direct_mappings() {
    use kmemcg::{Ownership, PageSource};
    let k: &'static Kmem<OsPages> = Box::leak(Box::new(Kmem::new(OsPages::with_max_chunks(0))));
    let l = Layout::from_size_align(5 << 20, PAGE_SIZE).unwrap();
    // SAFETY: a valid layout, freed once.
    unsafe {
        let p = k.alloc(l);
        assert!(!p.is_null());
        assert_eq!(k.source().ownership(p.addr()), Ownership::Owned);
        assert_eq!(k.source().ownership(p.addr() + l.size() - 1), Ownership::Owned);
        // The mapping's tail past the object went back at once (with
        // detection on, the object has a trailer: one page more).
        if !k.detection().is_on() {
            assert_eq!(k.source().ownership(p.addr() + l.size()), Ownership::Foreign);
        }
        k.dealloc(p, l);
    }
    assert_eq!(k.stats().bad_frees, 0);
    assert_eq!(k.stats().source.pages_in_use, 0);
}
