//! Slab geometry: how one cache's objects, header and bitmaps are laid
//! out in its slabs.

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

/// How objects are laid out in a slab of one cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Object stride in bytes (a multiple of `align`, at least a pointer),
    /// and object alignment (at most `PAGE_SIZE`).
    pub(crate) size: usize,
    pub(crate) align: usize,
    /// log2 of the pages per slab.
    pub(crate) order: u32,
    /// Objects per slab, and the offset of the first from the slab start.
    pub(crate) capacity: usize,
    pub(crate) first: usize,
    /// `ceil(2^64 / size)`: [`Geometry::index_of`] divides by `size` with
    /// one multiplication (Lemire, Kaser & Kurz, "Faster remainder by
    /// direct computation", 2019), exact for offsets below 2^32.
    pub(crate) recip: u64,
}

impl Geometry {
    /// The layout for objects of `size` bytes aligned to `align` (a power of
    /// two): the smallest slab order whose waste (header, padding and tail)
    /// is under 1/8 of the slab, or the least wasteful order up to
    /// [`MAX_SLAB_ORDER`]. `None` if an object does not fit a 1 MiB slab.
    pub(crate) const fn new(size: usize, align: usize) -> Option<Geometry> {
        if !align.is_power_of_two() || align > PAGE_SIZE {
            return None;
        }
        // At least a word, the smallest class; small alignments (the
        // 12-byte class) stay as asked.
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
            if let Some(g) = Self::at_order(size, align, order) {
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
        if align.is_power_of_two() && align <= PAGE_SIZE {
            let min = core::mem::size_of::<usize>();
            let size = if size < min { min } else { size };
            if let Some(s) = size.checked_add(align - 1)
                && let Some(g) = Self::at_order(s & !(align - 1), align, order)
                && g.capacity >= min_objects
            {
                return Some(g);
            }
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
        Some(Geometry { size, align, order, capacity, first, recip: u64::MAX / size as u64 + 1 })
    }

    /// Pages per slab.
    #[inline]
    pub(crate) const fn slab_pages(&self) -> usize {
        1 << self.order
    }

    /// Words of a slab's free bitmap.
    #[inline(always)]
    pub(crate) const fn words(&self) -> usize {
        self.capacity.div_ceil(64)
    }

    /// The index of the object at byte `off` from the first object, or
    /// `None` if `off` is not a multiple of `size`. `off` must be below
    /// 2^32 (slabs are at most 1 MiB).
    #[inline(always)]
    pub(crate) const fn index_of(&self, off: usize) -> Option<usize> {
        let q = ((self.recip as u128 * off as u128) >> 64) as usize;
        if q * self.size == off { Some(q) } else { None }
    }
}
