//! The held fast paths racing drains (review of session 25's hot path):
//! grouped allocations, frees of other threads' objects, a typed cache's
//! frees (`free_typed`), and, with sampling on and no group, frees while
//! a sampled object lives (the `DEBUG`-alone branch of `free_flagged`,
//! served under the hold), all on threads racing a thread that drains
//! every slot over and over (`shrink`, `reap`, a typed cache's `shrink`,
//! and with groups, groups made, charged and removed).
//!
//! Every block carries its own tag in every word and is checked before
//! its free, so two live blocks that overlap fail the test; at the end
//! every object is back, the groups are uncharged, and (feature
//! `paranoid`) the allocator's invariants hold.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kmemcg::{CacheBox, CacheFlags, Detection, Kmem, OsPages};

static PLAIN: Kmem = Kmem::new(OsPages::new());
/// One allocation in 13 sampled: a sampled object lives most of the time.
static SAMPLED: Kmem = Kmem::new(OsPages::new()).with_detection(Detection::sampled(13));
/// Sampling at the default rate, where no group is ever made: while the
/// first object (a sample) lives, the mode word shows `DEBUG` alone.
/// (At a rate as high as `SAMPLED`'s, `ARMED` is always set too.)
static SAMPLED_NO_GROUPS: Kmem = Kmem::new(OsPages::new()).with_detection(Detection::SAMPLED);

const WORKERS: usize = 3;
const STEPS: usize = 40_000;
/// Blocks a worker keeps before it hands its oldest to the next worker.
const KEEP: usize = 48;

/// A block of `len` bytes, every word `tag`.
struct Block {
    p: *mut u64,
    len: usize,
    tag: u64,
}
// SAFETY: a block is owned by one thread at a time (moved through the
// mailboxes).
unsafe impl Send for Block {}

fn layout(len: usize) -> Layout {
    Layout::from_size_align(len, 8).unwrap()
}

fn new_block(k: &Kmem, len: usize, tag: u64) -> Block {
    // SAFETY: a valid layout of non-zero size.
    let p = unsafe { k.alloc(layout(len)) }.cast::<u64>();
    assert!(!p.is_null(), "allocation failed");
    for i in 0..len / 8 {
        // SAFETY: inside the fresh block.
        unsafe { p.add(i).write(tag) };
    }
    Block { p, len, tag }
}

fn free_block(k: &Kmem, b: Block) {
    for i in 0..b.len / 8 {
        // SAFETY: inside the live block.
        let w = unsafe { b.p.add(i).read() };
        assert_eq!(w, b.tag, "block {:p} word {i} overwritten: blocks overlap", b.p);
    }
    // SAFETY: allocated by `k` with this layout, freed once.
    unsafe { k.dealloc(b.p.cast(), layout(b.len)) };
}

type Typed<'k> = CacheBox<'k, [u64; 6], Kmem>;

struct Mailbox<'k> {
    blocks: Vec<Block>,
    typed: Vec<(Typed<'k>, u64)>,
}

fn check_typed((b, tag): (Typed<'_>, u64)) {
    assert!(b.iter().all(|&w| w == tag), "typed object overwritten: objects overlap");
    drop(b);
}

/// Rounds of the race per test: a drain that a push overlaps is a
/// narrow window, so more rounds find it more often (a free that ignored
/// the drain count failed one run in three with one round).
const ROUNDS: usize = 6;

/// [`race_round`], [`ROUNDS`] times.
fn race_drains(k: &'static Kmem, grouped: bool) {
    for _ in 0..ROUNDS {
        race_round(k, grouped);
    }
}

/// Runs the race on `k` once, with two groups the workers take turns in
/// if `grouped`, with none at all otherwise.
fn race_round(k: &'static Kmem, grouped: bool) {
    let groups: Vec<_> = if grouped {
        vec![k.root().create_child("a").unwrap(), k.root().create_child("b").unwrap()]
    } else {
        Vec::new()
    };
    let flags = if grouped { CacheFlags::ACCOUNT } else { CacheFlags::NONE };
    let cache = k.create_cache::<[u64; 6]>("drain-race", flags).unwrap();
    let boxes: Vec<Mutex<Mailbox>> =
        (0..WORKERS).map(|_| Mutex::new(Mailbox { blocks: Vec::new(), typed: Vec::new() })).collect();
    let stop = AtomicBool::new(false);
    let drains = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (groups, cache, boxes) = (&groups, &cache, &boxes);
                s.spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64) << 32;
                    let mut next = || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    let mut mine: Vec<Block> = Vec::new();
                    let mut typed: Vec<(Typed, u64)> = Vec::new();
                    for step in 0..STEPS {
                        let tag = ((w as u64) << 48) | step as u64;
                        {
                            let _in = grouped.then(|| groups[(w + step / 64) % 2].enter());
                            let len = 8 * (1 + next() as usize % 384);
                            mine.push(new_block(k, len, tag));
                            if step % 4 != 3 {
                                typed.push((cache.alloc([tag; 6]).unwrap(), tag));
                            }
                        }
                        // Frees run outside and inside groups alike.
                        let _in = (grouped && step % 3 == 0).then(|| groups[w % 2].enter());
                        if mine.len() > KEEP {
                            let handed: Vec<Block> = mine.drain(..KEEP / 2).collect();
                            let typed_handed: Vec<_> = typed.drain(..typed.len() / 2).collect();
                            let mut b = boxes[(w + 1) % WORKERS].lock().unwrap();
                            b.blocks.extend(handed);
                            b.typed.extend(typed_handed);
                        }
                        if step % 8 == 0 {
                            let got = std::mem::replace(
                                &mut *boxes[w].lock().unwrap(),
                                Mailbox { blocks: Vec::new(), typed: Vec::new() },
                            );
                            got.blocks.into_iter().for_each(|b| free_block(k, b));
                            got.typed.into_iter().for_each(check_typed);
                        }
                        if next() % 5 == 0
                            && let Some(b) = mine.pop()
                        {
                            free_block(k, b);
                        }
                    }
                    mine.into_iter().for_each(|b| free_block(k, b));
                    typed.into_iter().for_each(check_typed);
                })
            })
            .collect();
        s.spawn(|| {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                k.shrink();
                k.reap();
                // The typed cache's drain most often: its frees are the
                // fewest.
                for _ in 0..3 {
                    cache.shrink();
                }
                if grouped {
                    let g = k.root().create_child(&format!("tmp{}", n % 4)).unwrap();
                    let b = {
                        let _in = g.enter();
                        new_block(k, 200, u64::MAX)
                    };
                    g.remove().unwrap();
                    free_block(k, b);
                }
                n += 1;
                std::thread::yield_now();
            }
            drains.store(n, Ordering::Relaxed);
        });
        for h in workers {
            h.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    for b in &boxes {
        let got = std::mem::replace(&mut *b.lock().unwrap(), Mailbox { blocks: Vec::new(), typed: Vec::new() });
        got.blocks.into_iter().for_each(|b| free_block(k, b));
        got.typed.into_iter().for_each(check_typed);
    }
    assert!(drains.load(Ordering::Relaxed) > 0, "the drainer never ran");
    k.shrink();
    assert_eq!(cache.stats().active_objects, 0, "typed objects were lost");
    for g in &groups {
        assert_eq!(g.usage(), 0, "{}: stayed charged", g.name());
    }
    #[cfg(feature = "paranoid")]
    k.check_invariants();
    drop(boxes);
    drop(cache);
    for g in groups {
        g.remove().unwrap();
    }
}

#[test]
fn grouped_and_typed_frees_race_drains() {
    race_drains(&PLAIN, true);
}

#[test]
fn grouped_frees_while_a_sample_lives_race_drains() {
    race_drains(&SAMPLED, true);
}

#[test]
fn frees_while_a_sample_lives_and_no_group_race_drains() {
    let k = &SAMPLED_NO_GROUPS;
    let kept = new_block(k, 64, 7);
    assert!((kept.p.addr() + 64).is_multiple_of(4096), "the first allocation is a sample");
    race_drains(k, false);
    free_block(k, kept);
}
