//! Where a cache's slabs come from and who pays for them.

use core::ptr::{self, NonNull};

use super::Geometry;
use crate::counter::PageCounter;
use crate::page::free_exact;
use crate::platform::{PAGE_SIZE, PageRun, PageSource};

/// Why a cache could not grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GrowError {
    /// The page source is exhausted.
    OutOfMemory,
    /// The charge was refused by this counter (the cache's or an ancestor).
    Limit(*const PageCounter),
}

/// Where a cache's slabs come from and who pays for them: a page source,
/// and for accounted caches the counter charged for every slab (through
/// the stock of CPU `slot` when there is one).
pub(crate) struct Pages<'a, S> {
    pub(crate) src: &'a S,
    pub(crate) counter: Option<&'a PageCounter>,
    pub(crate) slot: Option<usize>,
    /// What new slab headers name as their cache: a pointer to the
    /// structure that holds the cache at its start (a `MagCache`), with
    /// that structure's provenance, so the owner found from an object can
    /// be used as a whole; null: the cache itself.
    pub(crate) owner: *const (),
    /// Pages each level of `counter` may go past its `max` for a grow (0:
    /// none); an overdrawn grow takes no stock (`slot` is then `None`).
    pub(crate) overdraft: usize,
}

impl<'a, S: PageSource> Pages<'a, S> {
    /// Unaccounted pages from `src`.
    #[inline]
    pub(crate) fn plain(src: &'a S) -> Self {
        Pages { src, counter: None, slot: None, owner: ptr::null(), overdraft: 0 }
    }

    /// A run for a new slab of `geo`, charged first: `2^order` pages, of
    /// which an exact slab keeps `geo.slab_pages()` and gives the rest
    /// back at once (only those it keeps are charged).
    pub(super) fn grow(&self, geo: &Geometry, node: usize) -> Result<PageRun, GrowError> {
        let pages = geo.slab_pages();
        if let Some(c) = self.counter {
            let r = if self.overdraft == 0 {
                c.try_charge_stocked(self.slot, pages)
            } else {
                c.try_charge_over(pages, self.overdraft)
            };
            r.map_err(|k| GrowError::Limit(k))?;
        }
        match self.src.alloc_pages(geo.order, node) {
            Some(run) => {
                if geo.is_exact() {
                    let tail = run.addr.as_ptr().wrapping_add(pages * PAGE_SIZE);
                    // SAFETY: the pages past the slab's end are an unused part
                    // of the run just allocated, nothing refers to them, and
                    // `NonNull`: they lie inside it.
                    unsafe { free_exact(self.src, NonNull::new_unchecked(tail), (1 << geo.order) - pages) };
                }
                if let Some(c) = self.counter {
                    c.add_node_pages(run.node, pages);
                }
                Ok(run)
            }
            None => {
                if let Some(c) = self.counter {
                    c.uncharge_stocked(self.slot, pages);
                }
                Err(GrowError::OutOfMemory)
            }
        }
    }

    /// Gives slabs of `geo` back to the source and uncharges them: one call
    /// into the source (for slabs that keep their whole run) and one
    /// uncharge.
    ///
    /// # Safety
    ///
    /// Each run is the start of a slab of `geo` that `grow` made with the
    /// same counter, given back once, and nothing uses its pages after.
    pub(super) unsafe fn release_bulk(&self, runs: &[NonNull<u8>], geo: &Geometry) {
        if geo.is_exact() {
            for &r in runs {
                // SAFETY: forwarded: the pages the slab kept of its run.
                unsafe { free_exact(self.src, r, geo.slab_pages()) };
            }
        } else {
            // SAFETY: forwarded: whole runs of the slab order.
            unsafe { self.src.free_pages_bulk(runs, geo.order) };
        }
        if let Some(c) = self.counter {
            c.uncharge_stocked(self.slot, runs.len() * geo.slab_pages());
        }
    }
}
