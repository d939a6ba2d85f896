//! Slab geometry: how one cache's objects, header and bitmaps are laid
//! out in its slabs, and how large a slab may be for the memory at hand.
//!
//! A slab is a naturally aligned run of `2^order` pages: a free finds its
//! header by masking the object's address with the slab size, so every
//! slab of a cache has the cache's one order. [`Geometry::new`] picks the
//! smallest order from [`MIN_ORDER`] (8 pages) up to [`TIGHT_ORDER_MAX`]
//! whose waste (header, padding, tail) is under 1/32 of the slab, else the
//! smallest from [`MIN_ORDER`] under 1/8, which for the size classes means
//! slabs of 8 to 64 pages (the 4, 10, 12 and 16 KiB classes): cheap in a large page
//! source, where the pages of a slab that no object of them was written
//! are never touched, but in a 100 KiB region a 64 KiB slab for one 4 KiB
//! object cannot even be found, and 32 KiB per class in use is memory.
//!
//! So a cache's order is capped by the memory its page source holds
//! ([`order_cap`]): a slab is at most 1/8 of a fixed source's pages (and
//! no larger than its largest free run), as Linux SLUB falls back to
//! smaller slabs where a higher order is not to be had, except that here
//! the order is chosen once, since every slab of a cache must have its
//! order. A bounded source starts from [`Geometry::smallest`] (from
//! order 0, the smallest slabs that waste under 1/8: one page for every
//! class up to 448 B and some above). A cache whose slabs would still be
//! larger than the cap gets [`Geometry::capped`]: the smallest order up to
//! the cap whose waste is under 1/8, else the least wasteful one, counted in the pages its slabs
//! really keep, for a capped slab is *exact*: the pages of its run past
//! its last object go back to the source when it grows, as a large
//! object's do, and only the pages it keeps are charged (an 8 KiB object
//! with its page-aligned header keeps 3 pages of a 4-page run). If no
//! object fits a slab up to the cap (a page-aligned 4 KiB object needs a
//! header page before it), the smallest order that holds one. Caches
//! whose order is within the cap keep [`Geometry::smallest`]'s layout: a
//! source of 512 pages or more (a 2 MiB region and a page) leaves every
//! size class at that layout, and only a source of 2,048 pages or more
//! (8 MiB, a cap of [`MAX_SLAB_ORDER`]) or `OsPages`, which maps more on
//! demand, keeps [`Geometry::new`]'s. A `Kmem` reads its source's size once, at its first
//! use, and caps every cache it has then or creates later
//! (`Kmem::with_max_slab_order` fixes the cap instead); the table of
//! what that gives per region size is in `classes`.

use super::{HEADER, MAP_OFFSET, MAX_SLAB_ORDER};
use crate::platform::PAGE_SIZE;

/// Bytes of the bitmaps after the header of a slab of `bytes` holding
/// `size`-byte objects: the free bitmap, and with feature `hardened` the
/// allocation bitmap after it; each one bit per slot, in whole 8-byte
/// words.
const fn bitmap_bytes(bytes: usize, size: usize) -> usize {
    let words = (bytes / size).div_ceil(64);
    if cfg!(feature = "hardened") { words * 16 } else { words * 8 }
}

/// The largest slab order for a page source that holds `pages` pages
/// (`None`: one that maps more on demand, which gets
/// [`MAX_SLAB_ORDER`]) whose largest free run has order `largest`
/// (`None`: unknown or none): the largest `k` with `8 * 2^k <= pages`, at
/// most `largest`, so a slab is at most 1/8 of the memory and can be found
/// in it (see the module docs).
pub(crate) const fn order_cap(pages: Option<usize>, largest: Option<u32>) -> u32 {
    let Some(pages) = pages else { return MAX_SLAB_ORDER };
    let mut k = 0;
    while k < MAX_SLAB_ORDER && (8usize << (k + 1)) <= pages {
        k += 1;
    }
    match largest {
        Some(l) if l < k => l,
        _ => k,
    }
}

/// The smallest slab order of a cache in a page source that maps more on
/// demand (`OsPages`, or a source of at least 2,048 pages): 32 KiB slabs.
/// A slab's header and bitmap are in its first page and free objects hold
/// nothing the allocator reads, so pages of a slab that no object of them
/// was written are never touched; in one-page slabs every slab's header
/// faulted its page in (a million 64-byte objects allocated and not
/// written: 18,517 minor faults and 76 MiB resident with one-page slabs,
/// 4,169 and 19 MiB with these; BENCHMARKS.md, session 22), and a slab's list moves are paid once per
/// 510 objects instead of per 63. Bounded sources keep the smallest slabs
/// (`within`), where a slab per class in use is memory.
pub(crate) const MIN_ORDER: u32 = 3;

/// The largest order [`Geometry::new`] takes to waste under 1/32 of a slab
/// (256 KiB) before it settles for under 1/8 from [`MIN_ORDER`]. The
/// header and padding of a page-aligned class take a whole page: the 4 KiB
/// class wasted 1/16 of its 16-page slabs, the 1 KiB and 2 KiB classes
/// 1/32 of theirs, and they hold most of a mixed workload's bytes. In the
/// `random` workload (`cargo bench --bench memory`) pages held over peak
/// live went from 1.293 to 1.262 (under 1/16: 1.278), and batches of 1
/// and 4 KiB objects got faster (fewer slabs to go through); under 1/32
/// at any order gave the same figure, but the 16 KiB class 1 MiB slabs.
/// Classes from 1 KiB up to 12 KiB get larger slabs than under 1/8 alone:
/// 1 KiB 16 pages, 2 KiB 32, 2.5 and 3 KiB 16, 4 KiB 64, 5 and 6 KiB 32,
/// 10 and 12 KiB 64; the rest keep theirs (the 8, 14 and 16 KiB classes
/// waste 1/32 or more at every order up to this one). Untouched pages of
/// a slab cost no memory where the source maps on demand, the only
/// sources that take `new`.
pub(crate) const TIGHT_ORDER_MAX: u32 = 6;

/// How objects are laid out in a slab of one cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Object stride in bytes (a multiple of `align`, at least a pointer),
    /// and object alignment (at most `PAGE_SIZE`).
    pub(crate) size: usize,
    pub(crate) align: usize,
    /// log2 of the pages of the run a slab is cut from (its alignment).
    pub(crate) order: u32,
    /// Pages a slab keeps of that run: `2^order`, or fewer for an exact
    /// slab ([`Geometry::capped`]), whose run's pages past its last object
    /// go back to the page source at grow.
    pub(crate) pages: usize,
    /// Objects per slab, and the offset of the first from the slab start.
    pub(crate) capacity: usize,
    pub(crate) first: usize,
    /// `ceil(2^64 / size)`: [`Geometry::index_of`] divides by `size` with
    /// one multiplication (Lemire, Kaser & Kurz, "Faster remainder by
    /// direct computation", 2019), exact for offsets below 2^32.
    pub(crate) recip: u64,
    /// Where the slab's owner words start (0: it has none): one word per
    /// object, after the bitmaps, for caches that charge objects to
    /// groups one by one ([`Geometry::with_owners`]).
    pub(crate) owners: usize,
    /// `owners - 8 * (first / size)`, wrapping: with it the owner word of
    /// the object at byte `off` of its slab is at
    /// `owner_bias + 8 * (off / size)`, one division by multiplication
    /// and no subtraction of `first` ([`Geometry::owner_offset`]).
    pub(crate) owner_bias: usize,
    /// `!(slab bytes - 1)`: a slab's address from any of its bytes'.
    pub(crate) slab_mask: usize,
}

impl Geometry {
    /// The layout for objects of `size` bytes aligned to `align` (a power of
    /// two) in a page source that maps more on demand: the smallest slab
    /// order from [`MIN_ORDER`] up to [`TIGHT_ORDER_MAX`] whose waste
    /// (header, padding and tail) is under 1/32 of the slab, else the
    /// smallest from [`MIN_ORDER`] under 1/8, or the least wasteful order
    /// up to [`MAX_SLAB_ORDER`]. `None` if an object does not fit a 1 MiB slab.
    /// A bounded source takes [`Geometry::within`]'s instead.
    pub(crate) const fn new(size: usize, align: usize) -> Option<Geometry> {
        // First the smallest order up to `TIGHT_ORDER_MAX` that wastes
        // under 1/32 (see `TIGHT_ORDER_MAX`).
        let mut order = MIN_ORDER;
        while order <= TIGHT_ORDER_MAX {
            if let Some(g) = Self::fitted(size, align, order)
                && (PAGE_SIZE << order) - g.capacity * g.size < (PAGE_SIZE << order) / 32
            {
                return Some(g);
            }
            order += 1;
        }
        Self::from_order(size, align, MIN_ORDER)
    }

    /// [`Geometry::at_order`] for a requested size and alignment: at least
    /// a word (the smallest class; small alignments, as the 12-byte
    /// class's, stay as asked), rounded up to the alignment. `None` for an
    /// alignment above a page or not a power of two, or if no object fits.
    const fn fitted(size: usize, align: usize, order: u32) -> Option<Geometry> {
        if !align.is_power_of_two() || align > PAGE_SIZE {
            return None;
        }
        let min = core::mem::size_of::<usize>();
        let size = if size < min { min } else { size };
        match size.checked_add(align - 1) {
            Some(s) => Self::at_order(s & !(align - 1), align, order),
            None => None,
        }
    }

    /// The layout for a bounded page source before its cap: the smallest
    /// order (from 0) whose waste is under 1/8, else the least wasteful.
    pub(crate) const fn smallest(size: usize, align: usize) -> Option<Geometry> {
        Self::from_order(size, align, 0)
    }

    /// [`Geometry::new`] with the smallest order `min_order`.
    const fn from_order(size: usize, align: usize, min_order: u32) -> Option<Geometry> {
        let mut best: Option<Geometry> = None;
        let mut best_waste_ppm = usize::MAX;
        let mut order = min_order;
        while order <= MAX_SLAB_ORDER {
            if let Some(g) = Self::fitted(size, align, order) {
                let bytes = PAGE_SIZE << order;
                let waste = bytes - g.capacity * g.size;
                if waste * 8 < bytes {
                    return Some(g);
                }
                let ppm = waste * 1000 / (bytes / 1000);
                if ppm < best_waste_ppm {
                    best_waste_ppm = ppm;
                    best = Some(g);
                }
            }
            order += 1;
        }
        best
    }

    /// The layout for objects of `size` bytes aligned to `align` in slabs
    /// of `2^order` pages whatever the waste, if at least `min_objects`
    /// fit; else [`Geometry::new`]'s. For internal caches that must stay
    /// in small runs (a fragmented region may have no larger ones).
    pub(crate) const fn in_order(size: usize, align: usize, order: u32, min_objects: usize) -> Option<Geometry> {
        if let Some(g) = Self::fitted(size, align, order)
            && g.capacity >= min_objects
        {
            return Some(g);
        }
        Self::new(size, align)
    }

    /// The layout of `size`-byte objects (a multiple of `align`) in slabs
    /// of `2^order` pages, if one fits.
    const fn at_order(size: usize, align: usize, order: u32) -> Option<Geometry> {
        let bytes = PAGE_SIZE << order;
        let meta = MAP_OFFSET + bitmap_bytes(bytes, size);
        let meta = if meta < HEADER { HEADER } else { meta };
        let first = (meta + align - 1) & !(align - 1);
        if bytes < first + size {
            return None;
        }
        let capacity = (bytes - first) / size;
        Some(Geometry {
            size,
            align,
            order,
            pages: 1 << order,
            capacity,
            first,
            recip: u64::MAX / size as u64 + 1,
            owners: 0,
            owner_bias: 0,
            slab_mask: !((PAGE_SIZE << order) - 1),
        })
    }

    /// This layout with an owner word per object ahead of the first
    /// object, in slabs of the same order (so a free finds the slab of
    /// either layout by the same mask): what a cache of objects charged
    /// one by one needs to know whom to uncharge. `None` if no object
    /// would be left.
    pub(crate) const fn with_owners(self) -> Option<Geometry> {
        if self.owners != 0 {
            return Some(self);
        }
        let bytes = PAGE_SIZE << self.order;
        let meta = MAP_OFFSET + bitmap_bytes(bytes, self.size);
        let meta = if meta < HEADER { HEADER } else { meta };
        let owners = meta.next_multiple_of(8);
        let word = core::mem::size_of::<usize>();
        if bytes <= owners {
            return None;
        }
        let mut capacity = (bytes - owners) / (self.size + word);
        let mut first = (owners + capacity * word + self.align - 1) & !(self.align - 1);
        while capacity > 0 && first + capacity * self.size > bytes {
            capacity -= 1;
            first = (owners + capacity * word + self.align - 1) & !(self.align - 1);
        }
        if capacity == 0 {
            return None;
        }
        let mut g = self;
        g.capacity = capacity;
        g.first = first;
        g.owners = owners;
        g.owner_bias = owners.wrapping_sub(word * (first / self.size));
        g.pages = 1 << self.order;
        Some(if self.is_exact() { g.exact() } else { g })
    }

    /// The offset in its slab of the owner word of the object at byte
    /// `off` of the slab (a cache with owner words): `off / size` objects
    /// from the slab start, less the `first / size` the bias takes off
    /// (exact for every object: `off = first + k * size`, so the quotient
    /// is `k + first / size`).
    #[inline(always)]
    pub(crate) const fn owner_offset(&self, off: usize) -> usize {
        let q = ((self.recip as u128 * off as u128) >> 64) as usize;
        self.owner_bias.wrapping_add(q * core::mem::size_of::<usize>())
    }

    /// Whether slabs of `self` and `other` have objects of one size and
    /// alignment in runs of one order (a cache and its charged cache).
    #[inline]
    pub(crate) const fn same_slots(&self, other: &Geometry) -> bool {
        self.size == other.size && self.align == other.align && self.order == other.order
    }

    /// Whether the slabs carry owner words.
    #[inline(always)]
    pub(crate) const fn has_owners(&self) -> bool {
        self.owners != 0
    }

    /// This layout as an exact slab: it keeps only the pages up to the end
    /// of its last object.
    const fn exact(mut self) -> Geometry {
        self.pages = (self.first + self.capacity * self.size).div_ceil(PAGE_SIZE);
        self
    }

    /// `self` (a layout from [`Geometry::new`] or [`Geometry::in_order`])
    /// with its order capped at `cap` (see the module docs): unchanged if
    /// its order is within the cap, else [`Geometry::capped`]'s for its
    /// object size and alignment.
    pub(crate) const fn within(self, cap: u32) -> Geometry {
        // A bounded source: the smallest slabs that waste under 1/8, not
        // the large ones that spare a source mapping on demand page
        // faults and slab turnover (see [`MIN_ORDER`]).
        let this = match Self::smallest(self.size, self.align) {
            Some(small) if cap < MAX_SLAB_ORDER && small.order < self.order => small,
            _ => self,
        };
        if this.order <= cap {
            return this;
        }
        match Self::capped(this.size, this.align, cap) {
            Some(g) => g,
            // The object already fits a slab of `this.order`.
            None => this,
        }
    }

    /// The layout for objects of `size` bytes aligned to `align` (a power of
    /// two) in exact slabs of at most `2^cap` pages: the smallest order up
    /// to `cap` whose waste is under 1/8 of the pages it keeps, else the
    /// least wasteful one; if no object fits a slab up to `cap`, the
    /// smallest order that holds one. `None` if an object does not fit a
    /// 1 MiB slab.
    pub(crate) const fn capped(size: usize, align: usize, cap: u32) -> Option<Geometry> {
        if !align.is_power_of_two() || align > PAGE_SIZE {
            return None;
        }
        let min = core::mem::size_of::<usize>();
        let size = if size < min { min } else { size };
        let size = match size.checked_add(align - 1) {
            Some(s) => s & !(align - 1),
            None => return None,
        };
        let mut best: Option<Geometry> = None;
        let mut best_waste_ppm = usize::MAX;
        let mut order = 0;
        while order <= MAX_SLAB_ORDER {
            if order > cap && best.is_some() {
                return best;
            }
            if let Some(g) = Self::at_order(size, align, order) {
                let g = g.exact();
                if order > cap {
                    // No object fits a slab up to the cap: the first that holds one.
                    return Some(g);
                }
                let bytes = g.pages * PAGE_SIZE;
                let waste = bytes - g.capacity * g.size;
                if waste * 8 < bytes {
                    return Some(g);
                }
                // Per mille of a slab of at most 1 MiB, without overflow
                // where `usize` is 32 bits.
                let ppm = waste * 1000 / (bytes / 1000);
                if ppm < best_waste_ppm {
                    best_waste_ppm = ppm;
                    best = Some(g);
                }
            }
            order += 1;
        }
        best
    }

    /// Pages a slab keeps (see `pages`).
    #[inline]
    pub(crate) const fn slab_pages(&self) -> usize {
        self.pages
    }

    /// Whether a slab keeps fewer pages than its run has.
    #[inline]
    pub(crate) const fn is_exact(&self) -> bool {
        self.pages < 1 << self.order
    }

    /// Words of a slab's free bitmap.
    #[inline(always)]
    pub(crate) const fn words(&self) -> usize {
        self.capacity.div_ceil(64)
    }

    /// The index of the object at byte `off` from the first object, or
    /// `None` if `off` is not a multiple of `size`. `off` must be below
    /// 2^32 (slabs are at most 1 MiB): the answer for a larger one means
    /// nothing.
    ///
    /// One multiplication gives both: its high word is the quotient, and
    /// its low word is below `recip` exactly when `size` divides `off`
    /// (Lemire, Kaser & Kurz's divisibility test, for `recip =
    /// ceil(2^64 / size)` and offsets below 2^32).
    #[inline(always)]
    pub(crate) const fn index_of(&self, off: usize) -> Option<usize> {
        let p = self.recip as u128 * off as u128;
        if (p as u64) < self.recip { Some((p >> 64) as usize) } else { None }
    }
}
