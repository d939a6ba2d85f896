//! Alloc/free/realloc of arbitrary sizes and alignments through `Kmem` on a
//! small `Region`, checked against a shadow model for overlap, alignment and
//! content; ends by freeing everything and checking every page came back.
//! The input's first byte picks the allocator: the plain one, or one with
//! detection on over `OsPages` (red zones, poison, a quarantine, and one
//! size-class allocation in four on a guard page).

#![no_main]

use std::alloc::{GlobalAlloc, Layout};
use std::collections::BTreeMap;
use std::mem::MaybeUninit;

use arbitrary::Arbitrary;
use kmemcg::{Detection, Kmem, OsPages, PageSource, Region};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc { size: u16, big: bool, align_shift: u8 },
    Free { idx: u8 },
    Realloc { idx: u8, size: u16, big: bool },
}

fn size(s: u16, big: bool) -> usize {
    if big { (s as usize) * 64 } else { s as usize }
}

/// One allocator per process: every input ends with everything freed, so
/// each starts from the same state.
fn kmem() -> &'static Kmem<Region> {
    static K: std::sync::OnceLock<&'static Kmem<Region>> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let k: &'static Kmem<Region> = Box::leak(Box::new(Kmem::new(Region::new())));
        k.source().add(Box::leak(vec![MaybeUninit::uninit(); 8 << 20].into_boxed_slice()), 0).unwrap();
        k
    })
}

/// The detecting allocator, one per process like the plain one.
fn detecting() -> &'static Kmem<OsPages> {
    static K: std::sync::OnceLock<&'static Kmem<OsPages>> = std::sync::OnceLock::new();
    K.get_or_init(|| Box::leak(Box::new(Kmem::new(OsPages::new()).with_detection(Detection::ALL.guard_pages(4)))))
}

fuzz_target!(|input: (bool, Vec<Op>)| {
    let (detect, ops) = input;
    if detect { run(detecting(), ops) } else { run(kmem(), ops) }
});

fn run<S: PageSource>(k: &Kmem<S>, ops: Vec<Op>) {
    // (address -> (size, align, tag))
    let mut live: BTreeMap<usize, (usize, usize, u8)> = BTreeMap::new();
    let mut order: Vec<usize> = Vec::new();
    for (step, op) in ops.into_iter().enumerate() {
        let tag = step as u8 | 1;
        match op {
            Op::Alloc { size: s, big, align_shift } => {
                let (s, align) = (size(s, big).max(1), 1usize << (align_shift % 17));
                let Ok(l) = Layout::from_size_align(s, align) else { continue };
                // SAFETY: non-zero size.
                let p = unsafe { k.alloc(l) };
                if p.is_null() {
                    continue;
                }
                let a = p as usize;
                assert_eq!(a % align, 0, "misaligned");
                if let Some((&b, &(bs, _, _))) = live.range(..a + s).next_back() {
                    assert!(b + bs <= a, "overlap");
                }
                // SAFETY: a fresh block of `s` bytes.
                unsafe { p.write_bytes(tag, s) };
                live.insert(a, (s, align, tag));
                order.push(a);
            }
            Op::Free { idx } if !order.is_empty() => {
                let a = order.swap_remove(idx as usize % order.len());
                let (s, align, t) = live.remove(&a).unwrap();
                // SAFETY: a live block of `s` bytes.
                assert!(unsafe { std::slice::from_raw_parts(a as *const u8, s) }.iter().all(|&b| b == t));
                // SAFETY: freed once with its layout.
                unsafe { k.dealloc(a as *mut u8, Layout::from_size_align(s, align).unwrap()) };
            }
            Op::Realloc { idx, size: ns, big } if !order.is_empty() => {
                let i = idx as usize % order.len();
                let a = order[i];
                let (s, align, t) = live[&a];
                let ns = size(ns, big).max(1);
                if Layout::from_size_align(ns, align).is_err() {
                    continue;
                }
                // SAFETY: live block with its layout; non-zero new size.
                let p = unsafe { k.realloc(a as *mut u8, Layout::from_size_align(s, align).unwrap(), ns) };
                if p.is_null() {
                    continue;
                }
                live.remove(&a);
                // SAFETY: the kept prefix of the block.
                assert!(
                    unsafe { std::slice::from_raw_parts(p, s.min(ns)) }.iter().all(|&b| b == t),
                    "realloc lost data"
                );
                assert_eq!(p as usize % align, 0);
                if let Some((&b, &(bs, _, _))) = live.range(..p as usize + ns).next_back() {
                    assert!(b + bs <= p as usize, "realloc overlap");
                }
                // SAFETY: the block is `ns` bytes now.
                unsafe { p.write_bytes(t, ns) };
                live.insert(p as usize, (ns, align, t));
                order[i] = p as usize;
            }
            _ => {}
        }
    }
    k.check_invariants();
    for (a, (s, align, _)) in live {
        // SAFETY: freed once with its layout.
        unsafe { k.dealloc(a as *mut u8, Layout::from_size_align(s, align).unwrap()) };
    }
    k.shrink();
    assert_eq!(k.stats().bad_frees, 0);
    assert_eq!(k.source().stats().pages_in_use, 0, "pages not returned");
}
