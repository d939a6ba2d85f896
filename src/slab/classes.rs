//! Size classes of the general-purpose caches.
//!
//! 8 B to 16 KiB, four classes per doubling from 32 B on (and 4-byte steps
//! below), so a request wastes at most 25% of its class: the worst case is a
//! request one byte above a class, e.g. 9 B in the 12 B class. A class's
//! objects are aligned to the largest power of two dividing its size (capped
//! at the page), so an over-aligned request moves up to the first class
//! whose alignment suffices; the 4 KiB, 8 KiB, 12 KiB and 16 KiB classes are
//! page aligned, so every alignment up to the page finds a class.
//!
//! # Slabs in small memory
//!
//! [`GEOMETRIES`] is each class's layout in a large page source: waste
//! under 1/32 in slabs of up to 64 pages, else under 1/8 (8 pages for
//! every class up to 896 B and for 1.25 to 1.75 KiB and 3.5 KiB; 16 for
//! 1, 2.5, 3 and 7 KiB; 32 for 2, 5, 6 and 8 KiB and 14 KiB; 64 for 4,
//! 10, 12 and 16 KiB). A `Kmem` over a fixed source starts from the smallest slabs
//! that waste under 1/8 and caps the order at its first use (see
//! `geometry`): with a cap of
//! 0 (a source of under 16 pages) every class up to 3.5 KiB has one-page
//! slabs, and the page-aligned classes, which need a header page before
//! their first object, keep the fewest pages that hold one: 2 for 4 KiB,
//! 3 for 8 KiB, 5 for 16 KiB (exact slabs, whose run's last pages go back
//! to the source). Each further order of cap halves the waste of those.
//!
//! What that gives a `Kmem` over one page-aligned region, with one CPU
//! slot (`NoCpus`), first thing after it is made (`examples/small_regions`
//! prints this table and `tests/small_regions.rs` checks it; before issue
//! 29, when every cache kept its largest slabs and every region a page of
//! metadata, "every allocation up to" was 896 B, 1,792 B, 3.5 KiB, 3.5
//! KiB, 14 KiB and 508 KiB):
//!
//! | region | slab order cap | region metadata | allocator metadata | every allocation up to | 64-byte boxes |
//! | ---: | ---: | ---: | ---: | ---: | ---: |
//! | 16 KiB | 0 | 0 | 4 KiB | 14 KiB | 189 |
//! | 32 KiB | 0 | 0 | 4 KiB | 28 KiB | 441 |
//! | 64 KiB | 1 | 0 | 4 KiB | 60 KiB | 945 |
//! | 100 KiB | 1 | 0 | 4 KiB | 60 KiB | 1,512 |
//! | 256 KiB | 3 | 0 | 4 KiB | 252 KiB | 3,969 |
//! | 1 MiB | 4 | 4 KiB | 4 KiB | 508 KiB | 16,002 |
//!
//! *Region metadata* is what the region keeps of the memory (a byte per
//! page, inside the `Region` for its first 64 pages per node, else a page
//! of the region); *allocator metadata* the magazine slab the first
//! allocation makes. *Every allocation up to* is the largest size such
//! that one allocation of any size up to it succeeds: a size class needs
//! its slab (the refill takes the object first and a magazine page only
//! if one is left), a larger block a run for itself and a header page (so
//! at most half the region when its metadata takes a page). *64-byte boxes* is how many fit at once.

use crate::platform::PAGE_SIZE;
use crate::slab::Geometry;
use crate::sync::at;

/// Object sizes of the classes, ascending.
pub(crate) const CLASS_SIZES: [usize; NCLASSES] = [
    8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896,
    1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 14336, 16384,
];
/// Number of size classes.
pub(crate) const NCLASSES: usize = 43;
/// The largest request served by a size class; larger ones get page runs.
pub const MAX_CLASS_SIZE: usize = 16384;

/// Alignment of a class's objects.
const fn natural_align(size: usize) -> usize {
    let a = 1usize << size.trailing_zeros();
    if a > PAGE_SIZE { PAGE_SIZE } else { a }
}

/// Slab geometry of each class.
pub(crate) const GEOMETRIES: [Geometry; NCLASSES] = {
    let mut out = [Geometry {
        size: 0,
        align: 0,
        order: 0,
        pages: 0,
        capacity: 0,
        first: 0,
        recip: 0,
        owners: 0,
        owner_bias: 0,
        slab_mask: 0,
    }; NCLASSES];
    let mut i = 0;
    while i < NCLASSES {
        out[i] = match Geometry::new(CLASS_SIZES[i], natural_align(CLASS_SIZES[i])) {
            Some(g) => g,
            None => panic!("size class does not fit a slab"),
        };
        i += 1;
    }
    out
};

/// The largest request the one-lookup path of [`class_of`] serves.
const LUT_MAX: usize = 4096;

/// `LUT[i]`: the smallest class of at least `4 * (i + 1)` bytes, whatever
/// its alignment. [`lut_class`] reads it at `((size - 1) | (align - 1)) >> 2`,
/// the size rounded up to the alignment, less one: the smallest class that
/// holds that many bytes is aligned to `align` (checked below at compile
/// time for every alignment and multiple of it up to [`LUT_MAX`]). Class
/// sizes are multiples of 4, so a row per 4 bytes loses nothing. 1 KiB,
/// so a request of any size up to a page, with any alignment that keeps
/// it there, costs one load and no branch on the size (as jemalloc's
/// `sz_size2index_lookup`).
const LUT: [u8; LUT_MAX / 4] = {
    let mut lut = [0u8; LUT_MAX / 4];
    let mut i = 0;
    while i < lut.len() {
        lut[i] = first_class_fitting(4 * (i + 1), 1) as u8;
        i += 1;
    }
    lut
};
// What `lut_class` rests on: for every alignment `a` up to `LUT_MAX` and
// every multiple `m` of it up to `LUT_MAX`, the smallest class holding `m`
// bytes is aligned to `a`.
const _: () = {
    let mut a = 1;
    while a <= LUT_MAX {
        let mut m = a;
        while m <= LUT_MAX {
            assert!(GEOMETRIES[LUT[(m - 1) >> 2] as usize].align >= a);
            m += a;
        }
        a *= 2;
    }
};
/// `BIG[(size + 1023) >> 10]`: smallest class holding `LUT_MAX < size <= 16384`.
const BIG: [u8; MAX_CLASS_SIZE / 1024 + 1] = {
    let mut lut = [0u8; MAX_CLASS_SIZE / 1024 + 1];
    let mut i = 0;
    while i < lut.len() {
        lut[i] = first_class_fitting(i * 1024, 1) as u8;
        i += 1;
    }
    lut
};

/// The smallest class of at least `size` bytes aligned to `align`; the
/// tables above ask only for sizes and alignments some class serves.
const fn first_class_fitting(size: usize, align: usize) -> usize {
    let mut c = 0;
    while c < NCLASSES - 1 && (CLASS_SIZES[c] < size || GEOMETRIES[c].align < align) {
        c += 1;
    }
    c
}

/// The class serving `size` bytes aligned to `align`, or `None` when the
/// request belongs on the page path (too large, or aligned above a page)
/// or is empty (`size == 0`, which the callers turn away off their fast
/// paths). `align` must be a power of two.
#[inline(always)]
pub(crate) fn class_of(size: usize, align: usize) -> Option<usize> {
    match lut_class(size, align) {
        Some(c) => Some(c.index()),
        None => class_of_large(size, align),
    }
}

/// [`class_of`] of the requests its one table serves, `0 < size` and
/// `size` rounded up to `align` at most [`LUT_MAX`] (`None` for the
/// others, which [`class_of_large`] takes): for the fast paths, which send
/// the rest out of line whole. The class comes as the request's last
/// byte, from which a fast path reads the index ([`SizeClass::index`])
/// where it needs that, and the base cache's place
/// ([`SizeClass::offset_in`]) where it needs the cache, each with one
/// load.
#[inline(always)]
pub(crate) fn lut_class(size: usize, align: usize) -> Option<SizeClass> {
    // `size` rounded up to `align` (a power of two), less one: no add, so
    // nothing overflows; a zero size wraps to all ones, and an alignment
    // above the table sets a bit past it, so one test sends both away (an
    // earlier test shifted the alignment left, which overflowed to zero
    // for 2^56 and up: the fuzzer found it).
    let last = size.wrapping_sub(1) | align.wrapping_sub(1);
    if last < LUT_MAX { Some(SizeClass(Found::Last(last))) } else { None }
}

/// A size class as a lookup found it (invariant: a request's last byte
/// below [`LUT_MAX`], or an index below [`NCLASSES`]).
///
/// Passed down the fast paths unevaluated, so that each branch loads what
/// it uses: the plain one the cache's offset, the moded one the index.
/// (Evaluated at the lookup, both loads ran before the mode test, LLVM
/// having no reason to sink them.)
#[derive(Clone, Copy)]
pub(crate) struct SizeClass(Found);

#[derive(Clone, Copy)]
enum Found {
    /// `(size - 1) | (align - 1)` of a request [`lut_class`] took: the
    /// index of its row in [`Offsets::TABLE`], and four times that of its
    /// row of [`LUT`] (give or take the two low bits).
    Last(usize),
    /// A class index.
    Index(usize),
}

impl SizeClass {
    /// Class `c`.
    ///
    /// # Safety
    ///
    /// `c < NCLASSES`.
    #[inline(always)]
    pub(crate) unsafe fn from_index(c: usize) -> SizeClass {
        debug_assert!(c < NCLASSES);
        SizeClass(Found::Index(c))
    }

    /// The class's index.
    #[inline(always)]
    pub(crate) fn index(self) -> usize {
        match self.0 {
            // SAFETY: `l` is below `LUT_MAX` (see the type).
            Found::Last(l) => *unsafe { at(&LUT, l >> 2) } as usize,
            Found::Index(c) => c,
        }
    }

    /// The byte offset of the class's item in `A` (see [`ClassArray`]):
    /// for a request the table took, read from a table of them, so a fast
    /// path finds the class's cache with one load (indexed by the
    /// request's last byte itself, no shift or mask) and one scaled add.
    #[cfg_attr(all(miri, feature = "std", not(loom)), allow(dead_code))] // classes out of line there
    #[inline(always)]
    pub(crate) fn offset_in<A: ClassArray>(self) -> usize {
        match self.0 {
            Found::Last(l) => {
                let table: &'static [u16; LUT_MAX] = &Offsets::<A>::TABLE;
                // SAFETY: `l` is below `LUT_MAX` (see the type).
                (*unsafe { at(table, l) } as usize) * OFFSET_UNIT
            }
            Found::Index(c) => A::BASE + c * A::STRIDE,
        }
    }
}

/// Where something holds one item per size class, in class order: `BASE`
/// bytes from its start to the first, `STRIDE` bytes from one to the next
/// (for [`SizeClass::offset_in`]).
pub(crate) trait ClassArray {
    /// The first item's offset.
    const BASE: usize;
    /// The items' size.
    const STRIDE: usize;
}

/// What [`Offsets::TABLE`] counts offsets in: the scale of an x86
/// address, so that the offset's multiply folds into the add of the
/// `Kmem`'s address (one `lea`).
const OFFSET_UNIT: usize = 8;

/// [`LUT`] as offsets of the classes' items in `A`, in [`OFFSET_UNIT`]s
/// (see [`SizeClass::offset_in`]), one row per value of a request's
/// `(size - 1) | (align - 1)`: 8 KiB for each `A` it is used with. A row
/// per value, not per four as [`LUT`]'s, spares every allocation and free
/// the mask (or shift) of that value, and the offset's scale folds into
/// the add of the `Kmem`'s address that the `u32` byte offsets of rows
/// per four took: one instruction on each operation of a fast path, for
/// 4 KiB of read-only data more (jemalloc's table of the same job is
/// 4 KiB of class indices, which then index a second table).
#[cfg_attr(all(miri, feature = "std", not(loom)), allow(dead_code))] // classes out of line there
struct Offsets<A>(core::marker::PhantomData<A>);

impl<A: ClassArray> Offsets<A> {
    const TABLE: [u16; LUT_MAX] = {
        assert!(A::BASE % OFFSET_UNIT == 0 && A::STRIDE % OFFSET_UNIT == 0);
        assert!((A::BASE + A::STRIDE * NCLASSES) / OFFSET_UNIT <= u16::MAX as usize);
        let mut t = [0u16; LUT_MAX];
        let mut i = 0;
        while i < t.len() {
            t[i] = ((A::BASE + LUT[i >> 2] as usize * A::STRIDE) / OFFSET_UNIT) as u16;
            i += 1;
        }
        t
    };
}

/// [`class_of`] for requests above [`LUT_MAX`] or aligned above 8.
#[inline]
pub(crate) fn class_of_large(size: usize, align: usize) -> Option<usize> {
    let idx = if size == 0 {
        return None;
    } else if size <= LUT_MAX {
        LUT[(size - 1) >> 2] as usize
    } else if size <= MAX_CLASS_SIZE {
        BIG[(size + 1023) >> 10] as usize
    } else {
        return None;
    };
    // SAFETY: both tables hold class indices below NCLASSES (built by
    // `first_class_fitting`, which never returns more than NCLASSES - 1).
    let class_align = unsafe { at(&GEOMETRIES, idx) }.align;
    if align <= class_align { Some(idx) } else { class_for_align(idx, align) }
}

/// Moves up from `idx` to the first class aligned to `align`.
#[cold]
fn class_for_align(mut idx: usize, align: usize) -> Option<usize> {
    if align > PAGE_SIZE {
        return None;
    }
    while idx < NCLASSES {
        if GEOMETRIES[idx].align >= align {
            return Some(idx);
        }
        idx += 1;
    }
    None
}
