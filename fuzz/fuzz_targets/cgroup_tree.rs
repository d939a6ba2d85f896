//! Create and remove groups, set limits, enter, allocate, free from other
//! groups, remove with live objects, reclaim; the accounting invariants are
//! checked along the way (`check_invariants`); it ends by freeing
//! everything and checking zero usage and every page returned.

#![no_main]

use std::alloc::{GlobalAlloc, Layout};
use std::mem::MaybeUninit;

use arbitrary::Arbitrary;
use kmemcg::{CacheFlags, Cgroup, Kmem, KmemCache, PageSource, Region};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Create { parent: u8 },
    Remove { g: u8 },
    SetMax { g: u8, kib: u16 },
    SetHigh { g: u8, kib: u16 },
    SetSoft { g: u8, kib: u16 },
    Alloc { g: u8, size: u16, typed: bool },
    Free { idx: u8, from: u8 },
    Reap,
    Shrink,
    Check,
}

fuzz_target!(|ops: Vec<Op>| {
    // One allocator and typed cache per process; each input removes its
    // groups and frees its objects, so each starts from the same state.
    static K: std::sync::OnceLock<(&'static Kmem<Region>, KmemCache<'static, [u64; 20], Region>, usize)> =
        std::sync::OnceLock::new();
    let (k, typed, baseline) = K.get_or_init(|| {
        let k: &'static Kmem<Region> = Box::leak(Box::new(Kmem::new(Region::new())));
        k.source().add(Box::leak(vec![MaybeUninit::uninit(); 8 << 20].into_boxed_slice()), 0).unwrap();
        let typed = k.create_cache::<[u64; 20]>("objs", CacheFlags::ACCOUNT).unwrap();
        k.shrink();
        let baseline = k.source().stats().pages_in_use;
        (k, typed, baseline)
    });
    let k = *k;
    let mut groups: Vec<Cgroup<'static, Region>> = vec![k.root()];
    let mut objs: Vec<(usize, Layout)> = Vec::new();
    let mut boxes = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        let pick = |g: u8| g as usize % groups.len();
        match op {
            Op::Create { parent } => {
                if groups.len() < 64 {
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
        }
        // No charge is ever forced: a group's usage never exceeds its
        // max (the peak may, if the max was lowered after it).
        for g in &groups {
            assert!(g.usage() <= g.max(), "usage above max in group {}", g.name());
        }
    }
    k.check_invariants();
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
