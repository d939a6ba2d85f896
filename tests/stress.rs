//! Threaded stress tests of the magazine layer over `OsPages` with
//! per-thread slots: random alloc/free with cross-thread frees, thread
//! churn with reap, producer/consumer frees.

#[path = "support/rng.rs"]
mod rng;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use kmemcg::{Kmem, OsPages, PageSource};
use rng::Rng;

fn kmem() -> &'static Kmem<OsPages> {
    Box::leak(Box::new(Kmem::new(OsPages::new())))
}

/// A block with its layout and the byte it is filled with.
#[derive(Clone, Copy)]
struct Block {
    addr: usize,
    size: usize,
    align: usize,
    tag: u8,
}

fn fill(b: &Block) {
    // SAFETY: a live block of `size` bytes owned by the caller.
    unsafe { (b.addr as *mut u8).write_bytes(b.tag, b.size) };
}

fn check_and_free(k: &Kmem<OsPages>, b: Block) {
    // SAFETY: a live block of `size` bytes owned by the caller.
    let s = unsafe { std::slice::from_raw_parts(b.addr as *const u8, b.size) };
    assert!(s.iter().all(|&x| x == b.tag), "block clobbered (size {})", b.size);
    // SAFETY: freed once with its layout.
    unsafe { k.dealloc(b.addr as *mut u8, Layout::from_size_align(b.size, b.align).unwrap()) };
}

fn random_block(k: &Kmem<OsPages>, rng: &mut Rng, tag: u8) -> Block {
    let size = match rng.below(8) {
        0..=5 => 1 + rng.below(256) as usize,
        6 => 1 + rng.below(4096) as usize,
        _ => 1 + rng.below(40_000) as usize,
    };
    let align = 1 << rng.below(7);
    // SAFETY: non-zero size.
    let p = unsafe { k.alloc(Layout::from_size_align(size, align).unwrap()) };
    assert!(!p.is_null());
    assert_eq!(p as usize % align, 0);
    let b = Block { addr: p as usize, size, align, tag };
    fill(&b);
    b
}

fn random_cross_thread(threads: usize) {
    let k = kmem();
    let pool: Arc<Mutex<Vec<Block>>> = Arc::new(Mutex::new(Vec::new()));
    let barrier = Arc::new(Barrier::new(threads));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9 + t as u64 * 7919);
                let mut mine: Vec<Block> = Vec::new();
                barrier.wait();
                for i in 0..60_000 {
                    match rng.below(10) {
                        0..=4 => mine.push(random_block(k, &mut rng, (t * 31 + i) as u8 | 1)),
                        5..=6 if !mine.is_empty() => {
                            let b = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                            check_and_free(k, b);
                        }
                        7 if !mine.is_empty() => {
                            // Hand a block to whichever thread takes it.
                            let b = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                            pool.lock().unwrap().push(b);
                        }
                        _ => {
                            let b = pool.lock().unwrap().pop();
                            if let Some(b) = b {
                                check_and_free(k, b);
                            }
                        }
                    }
                }
                for b in mine {
                    check_and_free(k, b);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    for b in pool.lock().unwrap().drain(..) {
        check_and_free(k, b);
    }
    assert_eq!(k.stats().bad_frees, 0);
    k.shrink();
    assert_eq!(k.source().stats().pages_in_use, 0, "pages leaked after {threads} threads");
}

#[test]
fn random_cross_thread_frees_2_threads() {
    random_cross_thread(2);
}

#[test]
fn random_cross_thread_frees_4_threads() {
    random_cross_thread(4);
}

#[test]
fn random_cross_thread_frees_8_threads() {
    random_cross_thread(8);
}

#[test]
fn thousand_short_lived_threads_then_reap() {
    let k = kmem();
    for round in 0..100 {
        let hs: Vec<_> = (0..10)
            .map(|t| {
                thread::spawn(move || {
                    let mut rng = Rng(round * 10 + t + 1);
                    let blocks: Vec<Block> = (0..200).map(|i| random_block(k, &mut rng, i as u8 | 1)).collect();
                    // Free everything: the magazines keep some objects cached
                    // and the thread exits holding them.
                    for b in blocks {
                        check_and_free(k, b);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }
    let before = k.source().stats().pages_in_use;
    // Slots are per thread, not per allocator: a slot one of our threads
    // left may already be held by a thread of another test running in
    // parallel, which keeps its magazines of this `Kmem` through the first
    // reap (it was used in this interval); the second reap drains it (idle
    // for a whole interval), as a periodic reap would.
    k.reap();
    k.reap();
    let after = k.source().stats().pages_in_use;
    // Nothing is live: at most a few slabs remain.
    assert!(after <= 8, "{after} pages still held after two reaps ({before} before)");
}

#[test]
fn producer_consumer_frees() {
    let k = kmem();
    let (tx, rx) = mpsc::sync_channel::<usize>(1024);
    let layout = Layout::from_size_align(64, 8).unwrap();
    let producer = thread::spawn(move || {
        for i in 0..200_000usize {
            // SAFETY: valid layout.
            let p = unsafe { k.alloc(layout) };
            assert!(!p.is_null());
            // SAFETY: a live 64-byte block.
            unsafe { (p as *mut usize).write(i) };
            tx.send(p as usize).unwrap();
        }
    });
    let consumer = thread::spawn(move || {
        let mut n = 0usize;
        while let Ok(p) = rx.recv() {
            // SAFETY: a live block written by the producer.
            assert_eq!(unsafe { (p as *const usize).read() }, n);
            // SAFETY: freed once.
            unsafe { k.dealloc(p as *mut u8, layout) };
            n += 1;
        }
        n
    });
    producer.join().unwrap();
    assert_eq!(consumer.join().unwrap(), 200_000);
    k.shrink();
    assert_eq!(k.source().stats().pages_in_use, 0);
}
