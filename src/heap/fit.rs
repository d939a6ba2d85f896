//! Slab geometry fitted to the page source: at its first use a `Kmem` caps
//! the slab order of every cache by the memory its source holds (see the
//! slab layer's `geometry` for the rule, and `classes` for what it gives
//! per region size), so a 64 KiB region and a 100 KiB kernel heap serve
//! every size class.

use lock_api::RawMutex;

use super::Kmem;
use crate::platform::{MAX_ORDER, PageSource, Platform};
use crate::slab::{Geometry, MAX_SLAB_ORDER, order_cap};
use crate::sync::{Ordering, atomic_usize, loom_const_fn};

/// `Kmem::slab_cap` before the first use: fit the cap to the source.
pub(super) const AUTO: usize = usize::MAX;

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    loom_const_fn! {
        /// Fixes the largest slab order of every cache (slabs of at most
        /// `2^order` pages, as Linux's `slub_max_order`; above 8 counts as
        /// 8) instead of fitting it to the page source at the first use.
        ///
        /// By default a `Kmem` reads its source's size when it is first
        /// used (an allocation, a cache or group made, a report): a source
        /// that maps more on demand (`OsPages`) gets slabs of 8 to 64
        /// pages, a fixed one (a [`crate::Region`]) the smallest slabs
        /// that waste under an eighth, of at most an eighth of its pages,
        /// so add the regions first. Fix the order when they come later,
        /// e.g. from the out-of-memory handler: 0 for a heap that stays
        /// small, 8 for one that will be large (8 keeps the large slabs;
        /// any order below it starts from the smallest).
        pub fn with_max_slab_order(mut self, order: u32) -> Self {
            let order = if order > MAX_SLAB_ORDER { MAX_SLAB_ORDER } else { order };
            self.slab_cap = atomic_usize(order as usize);
            self
        }
    }

    /// The largest slab order of this allocator's caches: fixed by
    /// [`Kmem::with_max_slab_order`], else fitted to the page source at
    /// the first use (which this call makes, if none was made yet).
    pub fn max_slab_order(&self) -> u32 {
        self.settle();
        // Relaxed: written before the first use published `home`, which
        // `settle` read with Acquire.
        self.slab_cap.load(Ordering::Relaxed) as u32
    }

    /// The layout of a new cache of `size`-byte objects aligned to
    /// `align`, its order capped as this allocator caps its caches; `None`
    /// if no slab holds one.
    pub(crate) fn cache_geometry(&self, size: usize, align: usize) -> Option<Geometry> {
        let cap = self.max_slab_order();
        Geometry::new(size, align).map(|g| g.within(cap))
    }

    /// [`Kmem::cache_geometry`] for an accounted cache, whose charged
    /// cache needs an owner word per object in slabs of the same order:
    /// where the object leaves no room for one (it fills its slab), the
    /// next order that does; `None` if none up to [`MAX_SLAB_ORDER`]. Past
    /// the cap if need be, as [`Geometry::within`] gives an object that
    /// fills no slab within the cap the smallest order that holds it (a
    /// review found a type that exactly filled a capped slab refused while
    /// every larger one was accepted).
    pub(crate) fn accounted_cache_geometry(&self, size: usize, align: usize) -> Option<Geometry> {
        let geo = self.cache_geometry(size, align)?;
        if geo.with_owners().is_some() {
            return Some(geo);
        }
        (geo.order + 1..=MAX_SLAB_ORDER).find_map(|o| {
            Geometry::in_order(geo.size, geo.align, o, 1).filter(|g| g.order == o && g.with_owners().is_some())
        })
    }

    /// Fits the slab order of every cache to the page source (or to the
    /// order fixed at construction), at the first use.
    ///
    /// # Safety
    ///
    /// As for `Cache::refit`, for every cache of this `Kmem`: the first
    /// use, with every other thread kept from reading a geometry until a
    /// `Release` store that they read with `Acquire` (`Kmem::settle`).
    pub(super) unsafe fn fit_to_source(&self) {
        let cap = match self.slab_cap.load(Ordering::Relaxed) {
            AUTO => {
                let mut runs = [0; MAX_ORDER as usize];
                let largest = if self.source.free_runs(&mut runs) {
                    runs.iter().rposition(|&n| n > 0).map(|k| k as u32)
                } else {
                    None
                };
                order_cap(self.source.fixed_pages(), largest)
            }
            fixed => fixed as u32,
        };
        self.slab_cap.store(cap as usize, Ordering::Relaxed);
        if cap >= MAX_SLAB_ORDER {
            return;
        }
        // SAFETY: forwarded (this `Kmem`'s caches, before any has a slab).
        unsafe {
            self.magazines.refit(self.magazines.geometry().within(cap));
            self.tree.refit(cap);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
