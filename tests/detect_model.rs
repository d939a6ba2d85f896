//! Detection, a review's model: random programs over groups with every check on and
//! frequent samples (every 3rd size-class allocation tried on a guard
//! page), through `CgroupAllocator` (allocate, grow, shrink, deallocate),
//! `GlobalAlloc::realloc` inside `enter`, objects handed to another thread
//! to free, groups removed while their objects live; each block holds its
//! own pattern, checked at every resize and free. At the end every group
//! is empty after a flush, every sampled run is gone, the quarantine is
//! empty.

use std::alloc::{GlobalAlloc, Layout};
use std::ptr::NonNull;
use std::sync::Mutex;

use kmemcg::allocator_api2::alloc::Allocator;
use kmemcg::{Detection, Kmem, OsPages};

struct Block {
    p: usize,
    l: Layout,
    tag: u8,
}
// SAFETY: a block of the allocator, owned by whoever holds it.
unsafe impl Send for Block {}

fn fill(p: *mut u8, n: usize, t: u8) {
    // SAFETY: a live block of at least `n` bytes.
    unsafe { p.write_bytes(t, n) };
}
fn check(p: *mut u8, n: usize, t: u8) {
    // SAFETY: a live block of at least `n` bytes.
    let b = unsafe { std::slice::from_raw_parts(p, n) };
    assert!(b.iter().all(|&x| x == t), "a block of {n} bytes lost its pattern {t:#x}");
}

fn run(k: &'static Kmem, seed: u64) {
    let root = k.root();
    let groups: Vec<_> = (0..4).map(|i| root.create_child(&format!("m{seed}-{i}")).unwrap()).collect();
    let shared: Mutex<Vec<Block>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for (ti, g) in groups.iter().enumerate() {
            let shared = &shared;
            s.spawn(move || {
                let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (ti as u64 + 1);
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let a = g.allocator();
                let mut live: Vec<Block> = Vec::new();
                for step in 0..20_000u32 {
                    let r = next();
                    let align = [8usize, 16, 64][(r % 3) as usize];
                    let size = ((r >> 8) as usize % 6000 / align + 1) * align;
                    let tag = (step % 251) as u8 + 1;
                    match (r >> 40) % 6 {
                        0 | 1 if live.len() < 300 => {
                            let l = Layout::from_size_align(size, align).unwrap();
                            let p = a.allocate(l).unwrap().cast::<u8>().as_ptr();
                            fill(p, size, tag);
                            live.push(Block { p: p as usize, l, tag });
                        }
                        2 if !live.is_empty() => {
                            let i = (r >> 20) as usize % live.len();
                            let b = &live[i];
                            check(b.p as *mut u8, b.l.size(), b.tag);
                            let new = Layout::from_size_align(size, b.l.align()).unwrap();
                            let ptr = NonNull::new(b.p as *mut u8).unwrap();
                            // SAFETY: a live block of `a`'s allocator with layout `b.l`.
                            let q = unsafe {
                                if new.size() >= b.l.size() { a.grow(ptr, b.l, new) } else { a.shrink(ptr, b.l, new) }
                            }
                            .unwrap()
                            .cast::<u8>()
                            .as_ptr();
                            check(q, b.l.size().min(new.size()), b.tag);
                            fill(q, new.size(), b.tag);
                            live[i] = Block { p: q as usize, l: new, tag: b.tag };
                        }
                        3 if !live.is_empty() => {
                            let i = (r >> 20) as usize % live.len();
                            let b = &live[i];
                            check(b.p as *mut u8, b.l.size(), b.tag);
                            let _in = g.enter();
                            // SAFETY: as above, through `GlobalAlloc`.
                            let q = unsafe { k.realloc(b.p as *mut u8, b.l, size) };
                            assert!(!q.is_null());
                            check(q, b.l.size().min(size), b.tag);
                            fill(q, size, b.tag);
                            live[i] = Block {
                                p: q as usize,
                                l: Layout::from_size_align(size, b.l.align()).unwrap(),
                                tag: b.tag,
                            };
                        }
                        4 if !live.is_empty() => {
                            // Handed to whoever frees from the shared pile.
                            let b = live.swap_remove((r >> 20) as usize % live.len());
                            shared.lock().unwrap().push(b);
                        }
                        _ => {
                            let b = shared.lock().unwrap().pop().or_else(|| {
                                (!live.is_empty()).then(|| live.swap_remove((r >> 20) as usize % live.len()))
                            });
                            if let Some(b) = b {
                                check(b.p as *mut u8, b.l.size(), b.tag);
                                // SAFETY: a live block with layout `b.l`, freed once.
                                unsafe { k.dealloc(b.p as *mut u8, b.l) };
                            }
                        }
                    }
                }
                for b in live {
                    shared.lock().unwrap().push(b);
                }
            });
        }
    });
    // Two groups removed while their objects live; freed after.
    let (a, b) = (&groups[0], &groups[1]);
    let _ = (a.usage(), b.usage());
    let mut gs = groups.into_iter();
    let g0 = gs.next().unwrap();
    let g1 = gs.next().unwrap();
    g0.remove().unwrap();
    g1.remove().unwrap();
    for b in shared.into_inner().unwrap() {
        check(b.p as *mut u8, b.l.size(), b.tag);
        // SAFETY: as above.
        unsafe { k.dealloc(b.p as *mut u8, b.l) };
    }
    for g in gs {
        g.assert_empty();
        g.remove().unwrap();
    }
    k.shrink();
    assert_eq!(k.stats().quarantined, (0, 0));
    assert_eq!(k.stats().large_objects, 0, "a sampled run or large object outlived its free");
    assert_eq!(k.root().usage(), 0, "{}", k.root().stat());
}

#[test]
fn random_programs_with_detection_and_samples_give_everything_back() {
    let k: &'static Kmem = Box::leak(Box::new(
        Kmem::new(OsPages::new()).with_detection(Detection::ALL.guard_pages(3).quarantine(64 << 10)),
    ));
    for seed in 1..=3 {
        run(k, seed);
    }
}

#[test]
fn random_programs_with_sampling_alone_give_everything_back() {
    let k: &'static Kmem = Box::leak(Box::new(Kmem::new(OsPages::new()).with_detection(Detection::sampled(3))));
    for seed in 1..=3 {
        run(k, seed);
    }
}
