//! The `GlobalAlloc` surface with hostile layouts: every call must give
//! null or a correct block, never panic or corrupt a live block. The
//! input's first byte picks the allocator: the plain one, or one with
//! detection on over `OsPages` (red zones, poison, a quarantine, and one
//! size-class allocation in four on a guard page).

#![no_main]

use std::alloc::{GlobalAlloc, Layout};
use std::mem::MaybeUninit;

use arbitrary::Arbitrary;
use kmemcg::{Detection, Kmem, OsPages, PageSource, Region};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Call {
    size: usize,
    align_shift: u8,
    new_size: usize,
    keep: bool,
}

fuzz_target!(|input: (bool, Vec<Call>)| {
    // One allocator of each kind per process: every input ends with
    // everything freed.
    static K: std::sync::OnceLock<&'static Kmem<Region>> = std::sync::OnceLock::new();
    static D: std::sync::OnceLock<&'static Kmem<OsPages>> = std::sync::OnceLock::new();
    let (detect, calls) = input;
    if detect {
        // Detection poisons every byte of a block and its red zones: blocks
        // of at most 4 MiB, so a few huge ones do not take the fuzzer's
        // memory (the `Region` allocator has 4 MiB in all anyway).
        let k = *D.get_or_init(|| {
            Box::leak(Box::new(Kmem::new(OsPages::new()).with_detection(Detection::ALL.guard_pages(4))))
        });
        run(k, calls.into_iter().filter(|c| c.size <= 4 << 20 && c.new_size <= 4 << 20).collect())
    } else {
        run(
            *K.get_or_init(|| {
                let k: &'static Kmem<Region> = Box::leak(Box::new(Kmem::new(Region::new())));
                k.source().add(Box::leak(vec![MaybeUninit::uninit(); 4 << 20].into_boxed_slice()), 0).unwrap();
                k
            }),
            calls,
        )
    }
});

fn run<S: PageSource>(k: &Kmem<S>, calls: Vec<Call>) {
    // A live block that hostile calls must not disturb.
    let anchor = Layout::from_size_align(100, 8).unwrap();
    // SAFETY: valid layout.
    let a = unsafe { k.alloc(anchor) };
    assert!(!a.is_null());
    // SAFETY: 100 live bytes.
    unsafe { a.write_bytes(0x5a, 100) };
    let mut kept = Vec::new();
    for c in calls {
        let align = 1usize << (c.align_shift % 64);
        let Ok(l) = Layout::from_size_align(c.size, align) else { continue };
        if l.size() == 0 {
            // SAFETY: zero-size is bad input, answered with null.
            assert!(unsafe { k.alloc(l) }.is_null());
            continue;
        }
        // SAFETY: a valid non-zero layout.
        let p = unsafe { k.alloc(l) };
        if p.is_null() {
            continue;
        }
        assert_eq!(p as usize % align, 0);
        let n = l.size().min(1 << 16);
        // SAFETY: at least `n` bytes.
        unsafe { p.write_bytes(0xa5, n) };
        let ns = c.new_size.max(1);
        let p = if Layout::from_size_align(ns, align).is_ok() {
            // SAFETY: a live block with its layout, non-zero new size.
            let q = unsafe { k.realloc(p, l, ns) };
            if q.is_null() { (p, l) } else { (q, Layout::from_size_align(ns, align).unwrap()) }
        } else {
            (p, l)
        };
        if c.keep && kept.len() < 64 {
            kept.push(p);
        } else {
            // SAFETY: freed once with its layout.
            unsafe { k.dealloc(p.0, p.1) };
        }
    }
    // SAFETY: still live.
    assert!(unsafe { std::slice::from_raw_parts(a, 100) }.iter().all(|&b| b == 0x5a), "a live block was clobbered");
    for (p, l) in kept {
        // SAFETY: freed once.
        unsafe { k.dealloc(p, l) };
    }
    // SAFETY: freed once.
    unsafe { k.dealloc(a, anchor) };
    k.shrink();
    assert_eq!(k.source().stats().pages_in_use, 0);
}
