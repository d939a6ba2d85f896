//! Why the page source last came up short: what an allocation asked of it
//! (a slab of which cache, a large object of which size; the run's order
//! and pages) and what it held then (its free runs per order), recorded
//! without allocating, locking or logging when an allocation finds the
//! source exhausted even after reclaim, before the out-of-memory handler
//! is called: the handler, a test or a shell reads it with
//! [`Kmem::last_oom`].
//!
//! The record is a sequence lock over atomics: a writer makes the count
//! odd by CAS (a writer that finds another one writing leaves the record
//! to it, never waits), writes the fields `Relaxed` and makes the count
//! even with `Release`; a reader reads the count (`Acquire`), the fields,
//! an `Acquire` fence and the count again, and retries if it changed.

use core::fmt;

use lock_api::RawMutex;

use super::Kmem;
use crate::platform::{MAX_ORDER, PageSource, Platform};
use crate::slab::Geometry;
use crate::sync::{AtomicUsize, CellArray, Ordering, atomic_usize, fence, loom_const_fn, repeat};

/// Orders a report keeps: every order a page source has.
const ORDERS: usize = MAX_ORDER as usize;

/// What the allocation that found the page source exhausted was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OomSite {
    /// A new slab of a cache (a size class, a typed cache, or the charged
    /// cache of one): its objects' size (the class's size for a
    /// size class) and how many a slab holds.
    Slab {
        /// Bytes per object.
        object_size: usize,
        /// Objects per slab.
        objects: usize,
    },
    /// A page run for a large object (one above the largest size class,
    /// or aligned above a page) of `size` bytes: its pages and a header
    /// page.
    Large {
        /// The bytes asked for.
        size: usize,
    },
}

/// Why the page source last came up short; see [`Kmem::last_oom`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomReport {
    /// What the run was for.
    pub site: OomSite,
    /// The order of the run asked of the page source (`2^order` pages).
    pub order: u32,
    /// Pages the allocation would have kept of it (a slab's pages, or a
    /// large object's pages and its header page).
    pub pages: usize,
    /// The page source's free runs of each order at that moment
    /// (`free_runs[k]` runs of `2^k` pages), if it can tell
    /// (`PageSource::free_runs`; a [`crate::Region`] can).
    pub free_runs: Option<[usize; ORDERS]>,
    /// Times the page source has come up short so far (this one included).
    pub count: usize,
}

impl OomReport {
    /// Free pages in the source at that moment, if it could tell.
    pub fn free_pages(&self) -> Option<usize> {
        self.free_runs.map(|r| r.iter().enumerate().map(|(k, &n)| n << k).sum())
    }

    /// The order of the largest free run at that moment (`None` if the
    /// source held no free page or could not tell).
    pub fn largest_free_order(&self) -> Option<u32> {
        self.free_runs.and_then(|r| r.iter().rposition(|&n| n > 0)).map(|k| k as u32)
    }
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "out of memory: no free run of order {} ({} pages) for ", self.order, 1usize << self.order)?;
        match self.site {
            OomSite::Slab { object_size, objects } => {
                write!(f, "a slab for {object_size}-byte objects ({objects} a slab, {} pages)", self.pages)?
            }
            OomSite::Large { size } => {
                write!(f, "a large object of {size} bytes ({} pages with its header)", self.pages)?
            }
        }
        match self.free_runs {
            None => f.write_str("; the page source cannot list its free runs")?,
            Some(runs) => {
                write!(f, "; free pages {}", self.free_pages().unwrap_or(0))?;
                let mut sep = ": ";
                for (k, &n) in runs.iter().enumerate().filter(|(_, n)| **n > 0) {
                    write!(f, "{sep}{n} of order {k}")?;
                    sep = ", ";
                }
            }
        }
        write!(f, " (shortage {} so far)", self.count)
    }
}

/// `OomRecord::kind`.
const NONE: usize = 0;
const SLAB: usize = 1;
const LARGE: usize = 2;
/// `OomRecord::kind` flag: `runs` holds the source's free runs.
const RUNS: usize = 4;

/// The last report, as atomics (see the module docs).
pub(crate) struct OomRecord {
    /// Even when stable, odd while a writer writes; bumped by 2 per record.
    seq: AtomicUsize,
    /// `NONE`, `SLAB` or `LARGE`, with `RUNS`.
    kind: AtomicUsize,
    /// Object size (slab) or bytes asked for (large).
    size: AtomicUsize,
    /// Objects per slab (slab only).
    objects: AtomicUsize,
    order: AtomicUsize,
    pages: AtomicUsize,
    runs: CellArray<AtomicUsize, ORDERS>,
    /// Shortages recorded or skipped (a writer found another writing).
    count: AtomicUsize,
}

impl OomRecord {
    loom_const_fn! {
        pub(super) fn new() -> Self {
            OomRecord {
                seq: atomic_usize(0),
                kind: atomic_usize(NONE),
                size: atomic_usize(0),
                objects: atomic_usize(0),
                order: atomic_usize(0),
                pages: atomic_usize(0),
                runs: CellArray::new(repeat!(atomic_usize(0); ORDERS)),
                count: atomic_usize(0),
            }
        }
    }

    /// Records a shortage at `site` for a run of `order` of which `pages`
    /// were wanted, with `src`'s free runs now. Takes `src`'s locks: never
    /// called with an allocator lock held.
    fn record<S: PageSource>(&self, src: &S, site: OomSite, order: u32, pages: usize) {
        // Relaxed: a count of events, read by the report only.
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut runs = [0; ORDERS];
        let known = src.free_runs(&mut runs);
        let s = self.seq.load(Ordering::Relaxed);
        // Acquire: this writer's stores come after the last writer's
        // (Release) end; a writer that finds the record busy leaves it.
        if s & 1 == 1 || self.seq.compare_exchange(s, s + 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return;
        }
        let (kind, size, objects) = match site {
            OomSite::Slab { object_size, objects } => (SLAB, object_size, objects),
            OomSite::Large { size } => (LARGE, size, 0),
        };
        // Relaxed: published by the Release below.
        self.kind.store(kind | if known { RUNS } else { 0 }, Ordering::Relaxed);
        self.size.store(size, Ordering::Relaxed);
        self.objects.store(objects, Ordering::Relaxed);
        self.order.store(order as usize, Ordering::Relaxed);
        self.pages.store(pages, Ordering::Relaxed);
        for (slot, &n) in self.runs.iter().zip(&runs) {
            slot.store(if known { n } else { 0 }, Ordering::Relaxed);
        }
        // Release: the fields above before the even count (pairs with the
        // reader's Acquire fence and load).
        self.seq.store(s + 2, Ordering::Release);
    }

    /// A consistent copy of the record, or `None` if none was made (or a
    /// writer kept changing it).
    fn read(&self) -> Option<OomReport> {
        for _ in 0..64 {
            let s = self.seq.load(Ordering::Acquire);
            if s & 1 == 1 {
                crate::sync::spin_hint();
                continue;
            }
            let kind = self.kind.load(Ordering::Relaxed);
            let size = self.size.load(Ordering::Relaxed);
            let objects = self.objects.load(Ordering::Relaxed);
            let order = self.order.load(Ordering::Relaxed) as u32;
            let pages = self.pages.load(Ordering::Relaxed);
            let mut runs = [0; ORDERS];
            for (n, slot) in runs.iter_mut().zip(&self.runs) {
                *n = slot.load(Ordering::Relaxed);
            }
            let count = self.count.load(Ordering::Relaxed);
            // The field loads before the second count load (seqlock).
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != s {
                continue;
            }
            let site = match kind & !RUNS {
                SLAB => OomSite::Slab { object_size: size, objects },
                LARGE => OomSite::Large { size },
                _ => return None,
            };
            let free_runs = (kind & RUNS != 0).then_some(runs);
            return Some(OomReport { site, order, pages, free_runs, count });
        }
        None
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Why the page source last came up short, even after reclaim: which
    /// cache's slab (object size, objects per slab) or which large object,
    /// the order and pages of the run, and the source's free runs per
    /// order at that moment; `None` if it never did. Recorded before the
    /// out-of-memory handler ([`Kmem::set_oom_handler`]) is called, so the
    /// handler can read it; also when the handler then added memory and
    /// the allocation succeeded. Reads atomics only: it neither allocates
    /// nor locks. (A refused charge, a group at its `max`, is not a
    /// shortage: its error and events say which group.)
    pub fn last_oom(&self) -> Option<OomReport> {
        self.last_oom.read()
    }

    /// Records that no slab of `geo` could be grown.
    #[cold]
    pub(super) fn record_oom_slab(&self, geo: &Geometry) {
        let site = OomSite::Slab { object_size: geo.size, objects: geo.capacity };
        self.last_oom.record(&self.source, site, geo.order, geo.slab_pages());
    }

    /// Records that no run of `order` held the `pages` pages (header
    /// included) of a large object of `size` bytes.
    #[cold]
    pub(super) fn record_oom_large(&self, size: usize, order: u32, pages: usize) {
        self.last_oom.record(&self.source, OomSite::Large { size }, order, pages);
    }
}
