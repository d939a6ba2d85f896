//! Create and remove groups, set limits, enter, allocate, free from other
//! groups, remove with live objects, reclaim; the accounting invariants are
//! checked along the way (`check_invariants`); it ends by freeing
//! everything and checking zero usage and every page returned.
//!
//! Also (issue 13): guards held and dropped in any order, two threads
//! setting one group's max while a third allocates in it, up to 160
//! groups under contention with a shrinker holding objects in them, and
//! a shrinker that allocates from inside `scan` or lies in its counts.

#![no_main]

use std::alloc::{GlobalAlloc, Layout};
use std::mem::MaybeUninit;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use arbitrary::Arbitrary;
use kmemcg::{CacheFlags, Cgroup, GroupId, Kmem, KmemCache, PageSource, Region, ShrinkControl, Shrinker};
use libfuzzer_sys::fuzz_target;

const LRU_OBJ: Layout = match Layout::from_size_align(1000, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};

/// Objects charged to groups that reclaim may free, and two bad habits it
/// can be switched to: allocating inside `scan`, and lying in its counts.
struct Lru {
    kmem: std::sync::OnceLock<&'static Kmem<Region>>,
    entries: Mutex<Vec<(GroupId, usize)>>,
    allocates: AtomicBool,
    lies: AtomicBool,
}

impl Shrinker for Lru {
    fn count(&self, sc: &ShrinkControl) -> usize {
        if self.lies.load(Ordering::Relaxed) {
            return usize::MAX;
        }
        self.entries.lock().unwrap().iter().filter(|(g, _)| sc.contains(*g)).count()
    }
    fn scan(&self, sc: &ShrinkControl, nr: usize) -> usize {
        let k = *self.kmem.get().unwrap();
        if self.allocates.load(Ordering::Relaxed) {
            // Charged to whatever group is current, possibly one at its max:
            // it must fail or succeed, never recurse into reclaim.
            let l = Layout::from_size_align(64 << 10, 8).unwrap();
            // SAFETY: valid layout; freed at once.
            unsafe {
                let p = k.alloc(l);
                if !p.is_null() {
                    k.dealloc(p, l);
                }
            }
        }
        let victims: Vec<usize> = {
            let mut e = self.entries.lock().unwrap();
            let mut out = Vec::new();
            let mut i = 0;
            while i < e.len() && out.len() < nr {
                if sc.contains(e[i].0) { out.push(e.swap_remove(i).1) } else { i += 1 }
            }
            out
        };
        for &p in &victims {
            // SAFETY: taken off the list, so freed once.
            unsafe { k.dealloc(p as *mut u8, LRU_OBJ) };
        }
        if self.lies.load(Ordering::Relaxed) { usize::MAX } else { victims.len() }
    }
}

static LRU: Lru = Lru {
    kmem: std::sync::OnceLock::new(),
    entries: Mutex::new(Vec::new()),
    allocates: AtomicBool::new(false),
    lies: AtomicBool::new(false),
};

#[derive(Arbitrary, Debug)]
enum Op {
    Create {
        parent: u8,
    },
    Remove {
        g: u8,
    },
    SetMax {
        g: u8,
        kib: u16,
    },
    SetHigh {
        g: u8,
        kib: u16,
    },
    SetSoft {
        g: u8,
        kib: u16,
    },
    Alloc {
        g: u8,
        size: u16,
        typed: bool,
    },
    Free {
        idx: u8,
        from: u8,
    },
    Reap,
    Shrink,
    Check,
    /// Enter a group and keep the guard.
    Enter {
        g: u8,
    },
    /// Drop a kept guard, whichever (out of order is allowed).
    Leave {
        idx: u8,
    },
    /// Two threads set `g`'s max while a third allocates in it.
    RaceMax {
        g: u8,
        a: u16,
        b: u16,
    },
    /// An object in `g` that the shrinker can free.
    AddLru {
        g: u8,
    },
    /// Switch the shrinker's bad habits.
    ShrinkerHabits {
        allocates: bool,
        lies: bool,
    },
}

fuzz_target!(|ops: Vec<Op>| {
    // One allocator and typed cache per process; each input removes its
    // groups and frees its objects, so each starts from the same state.
    static K: std::sync::OnceLock<(&'static Kmem<Region>, KmemCache<'static, [u64; 20], Kmem<Region>>, usize)> =
        std::sync::OnceLock::new();
    let (k, typed, baseline) = K.get_or_init(|| {
        let k: &'static Kmem<Region> = Box::leak(Box::new(Kmem::new(Region::new())));
        k.source().add(Box::leak(vec![MaybeUninit::uninit(); 8 << 20].into_boxed_slice()), 0).unwrap();
        let typed = k.create_cache::<[u64; 20]>("objs", CacheFlags::ACCOUNT).unwrap();
        let _ = LRU.kmem.set(k);
        k.register_shrinker(&LRU).unwrap();
        k.shrink();
        let baseline = k.source().stats().pages_in_use;
        (k, typed, baseline)
    });
    let k = *k;
    let mut groups: Vec<Cgroup<'static, Kmem<Region>>> = vec![k.root()];
    let mut objs: Vec<(usize, Layout)> = Vec::new();
    let mut boxes = Vec::new();
    let mut guards = Vec::new();
    LRU.allocates.store(false, Ordering::Relaxed);
    LRU.lies.store(false, Ordering::Relaxed);
    for (i, op) in ops.into_iter().enumerate() {
        let pick = |g: u8| g as usize % groups.len();
        match op {
            Op::Create { parent } => {
                if groups.len() < 160 {
                    if let Ok(c) = groups[pick(parent)].create_child(&format!("g{i}")) {
                        groups.push(c);
                    }
                }
            }
            Op::Remove { g } => {
                let _ = groups[pick(g)].remove();
            }
            Op::SetMax { g, kib } => {
                let _ = groups[pick(g)].set_max(kib as usize * 1024);
            }
            Op::SetHigh { g, kib } => {
                let _ = groups[pick(g)].set_high(kib as usize * 1024);
            }
            Op::SetSoft { g, kib } => {
                let _ = groups[pick(g)].set_soft_limit(kib as usize * 1024);
            }
            Op::Alloc { g, size, typed: t } => {
                let _in = groups[pick(g)].enter();
                if t {
                    if let Ok(b) = typed.alloc([i as u64; 20]) {
                        boxes.push(b);
                    }
                } else {
                    let l = Layout::from_size_align((size as usize).max(1) * 4, 8).unwrap();
                    // SAFETY: valid layout.
                    let p = unsafe { k.alloc(l) };
                    if !p.is_null() {
                        objs.push((p as usize, l));
                    }
                }
            }
            Op::Free { idx, from } => {
                let _in = groups[pick(from)].enter();
                if !objs.is_empty() {
                    let (p, l) = objs.swap_remove(idx as usize % objs.len());
                    // SAFETY: freed once with its layout.
                    unsafe { k.dealloc(p as *mut u8, l) };
                } else if !boxes.is_empty() {
                    let b = boxes.swap_remove(idx as usize % boxes.len());
                    assert!(b.iter().all(|&x| x == b[0]));
                }
            }
            Op::Reap => {
                k.reap();
            }
            Op::Shrink => {
                k.shrink();
            }
            Op::Check => k.check_invariants(),
            Op::Enter { g } => {
                if guards.len() < 16 {
                    guards.push(groups[pick(g)].enter());
                }
            }
            Op::Leave { idx } => {
                if !guards.is_empty() {
                    drop(guards.swap_remove(idx as usize % guards.len()));
                }
            }
            Op::RaceMax { g, a, b } => {
                let g = &groups[pick(g)];
                let old = g.max();
                let (a, b) = (a as usize * 4096, b as usize * 4096);
                let (ra, rb, held) = std::thread::scope(|s| {
                    let ta = s.spawn(|| g.set_max(a));
                    let tb = s.spawn(|| g.set_max(b));
                    let tc = s.spawn(|| {
                        let _in = g.enter();
                        let l = Layout::from_size_align(3000, 8).unwrap();
                        // SAFETY: valid layout.
                        let p = unsafe { k.alloc(l) };
                        (p as usize, l)
                    });
                    (ta.join().unwrap(), tb.join().unwrap(), tc.join().unwrap())
                });
                if held.0 != 0 {
                    objs.push(held);
                }
                let max = g.max();
                if g.is_removed() {
                    // Both calls were refused; nothing changed.
                    assert_eq!(max, old);
                } else {
                    match (ra.is_ok(), rb.is_ok()) {
                        (true, true) => assert!(max == a || max == b, "max {max} is neither {a} nor {b}"),
                        (true, false) => assert_eq!(max, a, "the refused call changed the max"),
                        (false, true) => assert_eq!(max, b, "the refused call changed the max"),
                        (false, false) => assert_eq!(max, old, "two refused calls changed the max"),
                    }
                }
            }
            Op::AddLru { g } => {
                let g = &groups[pick(g)];
                let _in = g.enter();
                // SAFETY: valid layout.
                let p = unsafe { k.alloc(LRU_OBJ) };
                if !p.is_null() {
                    LRU.entries.lock().unwrap().push((k.current_group_id(), p as usize));
                }
            }
            Op::ShrinkerHabits { allocates, lies } => {
                LRU.allocates.store(allocates, Ordering::Relaxed);
                LRU.lies.store(lies, Ordering::Relaxed);
            }
        }
        // No charge is ever forced: a group's usage never exceeds its
        // max (the peak may, if the max was lowered after it).
        for g in &groups {
            assert!(g.usage() <= g.max(), "usage above max in group {}", g.name());
        }
    }
    // Guards dropped in creation order (the reverse of nesting), then the
    // thread made to let go of whatever that left current.
    drop(guards);
    k.reset_current_group();
    assert_eq!(k.current_group().name(), "/");
    LRU.allocates.store(false, Ordering::Relaxed);
    LRU.lies.store(false, Ordering::Relaxed);
    k.check_invariants();
    for (_, p) in std::mem::take(&mut *LRU.entries.lock().unwrap()) {
        // SAFETY: taken off the list, so freed once.
        unsafe { k.dealloc(p as *mut u8, LRU_OBJ) };
    }
    for (p, l) in objs {
        // SAFETY: freed once.
        unsafe { k.dealloc(p as *mut u8, l) };
    }
    drop(boxes);
    k.shrink();
    for g in &groups {
        assert_eq!(g.usage(), 0, "group {} still charged", g.name());
    }
    // Remove children before parents (creation order reversed).
    for g in groups.iter().rev() {
        let _ = g.remove();
    }
    drop(groups);
    k.shrink();
    k.check_invariants();
    assert_eq!(k.source().stats().pages_in_use, *baseline, "pages not back to the baseline");
});
