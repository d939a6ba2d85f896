//! The page map of `OsPages` under `--cfg loom`: the API of the OS build's
//! radix table (`page_map`) over a few *granules* of loom atomics, since
//! loom atomics cannot live in mapped memory and a table of 4,096 leaf
//! pointers would be 4,096 loom objects in every execution.
//!
//! A granule covers the pages of one 4 MiB-aligned span of addresses (one
//! pooled chunk: chunks are aligned to their size) with one bit per page.
//! Granules are taken in order, each by a CAS of its key, and keep their
//! span until the map is dropped, so a span has at most one granule and a
//! lookup stops at the first free one. With every granule taken, `mark`
//! fails and the mapping is given back: the source reports exhaustion (8
//! granules hold 32 MiB of mappings, far more than a loom model maps).
//!
//! Atomics, as in the OS build: a granule's key is published once by CAS
//! (`AcqRel`) and read with `Acquire`; a page's bit is set with `Release`
//! after the page is mapped and before any run in it is handed out,
//! cleared with `Release` before it is unmapped, and read with `Acquire`.

use super::super::PAGE_SHIFT;
use crate::sync::{AtomicUsize, Ordering, atomic_usize};

/// Pages one granule covers, a chunk's: 4 MiB.
const GRANULE_PAGES: usize = 1024;
/// Pages (bits) per bitmap word.
const WORD_PAGES: usize = usize::BITS as usize;
/// Bitmap words per granule.
const WORDS: usize = GRANULE_PAGES / WORD_PAGES;
/// Granules in one map.
const GRANULES: usize = 8;

/// The pages of one span of `GRANULE_PAGES` pages.
struct Granule {
    /// 0 while the granule is free, else the span's number (address
    /// `>> PAGE_SHIFT` / `GRANULE_PAGES`) plus one; set once by CAS.
    key: AtomicUsize,
    /// Bit `i` of word `w`: page `w * WORD_PAGES + i` of the span is held.
    bits: [AtomicUsize; WORDS],
}

/// Which pages lie in mappings an [`OsPages`](super::OsPages) holds (the
/// loom build; see the module docs).
pub(in crate::platform) struct PageMap {
    granules: [Granule; GRANULES],
}

impl PageMap {
    /// An empty map: no granule taken, no page set.
    pub(in crate::platform) fn new() -> Self {
        PageMap {
            granules: core::array::from_fn(|_| Granule {
                key: atomic_usize(0),
                bits: core::array::from_fn(|_| atomic_usize(0)),
            }),
        }
    }

    /// The granule of span `span`, if one was taken.
    fn find(&self, span: usize) -> Option<&Granule> {
        for g in &self.granules {
            match g.key.load(Ordering::Acquire) {
                0 => return None,
                k if k == span + 1 => return Some(g),
                _ => {}
            }
        }
        None
    }

    /// The granule of span `span`, taking the first free one if it has
    /// none; `None` when all are taken by other spans.
    fn find_or_take(&self, span: usize) -> Option<&Granule> {
        self.granules.iter().find(|g| {
            let key = match g.key.compare_exchange(0, span + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => span + 1,
                Err(k) => k,
            };
            key == span + 1
        })
    }

    /// Whether the page holding `addr` is set.
    pub(in crate::platform) fn contains(&self, addr: usize) -> bool {
        let page = addr >> PAGE_SHIFT;
        let Some(g) = self.find(page / GRANULE_PAGES) else { return false };
        let i = page % GRANULE_PAGES;
        g.bits[i / WORD_PAGES].load(Ordering::Acquire) & (1 << (i % WORD_PAGES)) != 0
    }

    /// Sets the pages of `[addr, addr + len)` (page-aligned), taking the
    /// granules they need first. `false`, with nothing set, if a granule
    /// cannot be had.
    pub(in crate::platform) fn mark(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else { return false };
        let (first, end) = (addr >> PAGE_SHIFT, end >> PAGE_SHIFT);
        for span in first / GRANULE_PAGES..end.div_ceil(GRANULE_PAGES) {
            if self.find_or_take(span).is_none() {
                return false;
            }
        }
        self.update(first, end, |w, mask| {
            w.fetch_or(mask, Ordering::Release);
        });
        true
    }

    /// Clears the pages of `[addr, addr + len)` (page-aligned).
    pub(in crate::platform) fn clear(&self, addr: usize, len: usize) {
        let Some(end) = addr.checked_add(len) else { return };
        self.update(addr >> PAGE_SHIFT, end >> PAGE_SHIFT, |w, mask| {
            w.fetch_and(!mask, Ordering::Release);
        });
    }

    /// Calls `f(word, mask)` for every bitmap word holding pages
    /// `first..end`, with the mask of those pages; skips spans without a
    /// granule.
    fn update(&self, first: usize, end: usize, f: impl Fn(&AtomicUsize, usize)) {
        let mut p = first;
        while p < end {
            let stop = end.min((p / GRANULE_PAGES + 1) * GRANULE_PAGES);
            if let Some(g) = self.find(p / GRANULE_PAGES) {
                while p < stop {
                    let i = p % GRANULE_PAGES;
                    let bit = i % WORD_PAGES;
                    let n = (WORD_PAGES - bit).min(stop - p);
                    let mask = (usize::MAX >> (WORD_PAGES - n)) << bit;
                    f(&g.bits[i / WORD_PAGES], mask);
                    p += n;
                }
            }
            p = stop;
        }
    }

    /// Clears every page, calling `f(addr, len)` for each run of set pages
    /// first (`OsPages`'s drop unmaps them). Exclusive access, so no loom
    /// operation: the model sees no step here.
    pub(in crate::platform) fn take_all(&mut self, mut f: impl FnMut(usize, usize)) {
        for g in &mut self.granules {
            let key = g.key.with_mut(|k| *k);
            if key == 0 {
                break;
            }
            let base = (key - 1) * GRANULE_PAGES;
            // The run of set pages being gathered: its first page.
            let mut run: Option<usize> = None;
            for (w, word) in g.bits.iter_mut().enumerate() {
                let bits = word.with_mut(core::mem::take);
                for i in 0..WORD_PAGES {
                    let page = base + w * WORD_PAGES + i;
                    match (bits & (1 << i) != 0, run) {
                        (true, None) => run = Some(page),
                        (false, Some(start)) => {
                            f(start << PAGE_SHIFT, (page - start) << PAGE_SHIFT);
                            run = None;
                        }
                        _ => {}
                    }
                }
            }
            if let Some(start) = run {
                f(start << PAGE_SHIFT, (base + GRANULE_PAGES - start) << PAGE_SHIFT);
            }
        }
    }
}
