//! Leak rows with requested sizes: what a cache still holds, read from
//! the headers of its live checked objects (a leak report's rows give the
//! sizes the code asked for, not the class that served them, whose slot
//! also holds the header and red zones).

use lock_api::RawMutex;

use super::header::{tag, words};
use super::{ALIVE, HEAD};
use crate::heap::Kmem;
use crate::magazine::MagCache;
use crate::platform::{PageSource, Platform};
use crate::sync::word_load_if_aligned;

/// Requested sizes a [`LeakSizes`] keeps apart, per cache; objects of
/// further sizes are counted together ([`LeakSizes::other`]).
pub(crate) const LEAK_SIZES: usize = 4;

/// The live checked objects of one cache by requested size: up to
/// [`LEAK_SIZES`] sizes, in the order first met, with their object counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LeakSizes {
    rows: [(usize, usize); LEAK_SIZES],
    /// The slot of the first object met of each row (its sites, when
    /// recorded, go with the row in a report).
    slots: [usize; LEAK_SIZES],
    n: usize,
    /// Objects of sizes past the first [`LEAK_SIZES`].
    pub(crate) other: usize,
}

impl LeakSizes {
    /// None.
    pub(crate) const EMPTY: LeakSizes =
        LeakSizes { rows: [(0, 0); LEAK_SIZES], slots: [0; LEAK_SIZES], n: 0, other: 0 };

    /// Counts one object of `size` bytes, in slot `slot`.
    fn add(&mut self, size: usize, slot: usize) {
        if let Some(r) = self.rows[..self.n].iter_mut().find(|r| r.0 == size) {
            r.1 += 1;
        } else if self.n < LEAK_SIZES {
            self.rows[self.n] = (size, 1);
            self.slots[self.n] = slot;
            self.n += 1;
        } else {
            self.other += 1;
        }
    }

    /// `(requested bytes, objects)` of each size kept apart.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.rows[..self.n].iter().copied()
    }

    /// `(requested bytes, objects, slot of the first)` of each size kept
    /// apart.
    pub(crate) fn iter_slots(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.rows[..self.n].iter().zip(&self.slots).map(|(&(b, n), &s)| (b, n, s))
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// The requested sizes of `cache`'s live checked objects (those with a
    /// live header: objects cached in magazines or the quarantine carry a
    /// freed one, and objects without a header, with detection off,
    /// sampling alone or aligned past a page, are not counted). Walks
    /// every slab of the cache under its node locks: for reports, never an
    /// allocation path.
    ///
    /// For a charged cache, `owner` picks one group's objects (its key).
    pub(crate) fn leak_sizes(&self, cache: &MagCache<R>, owner: Option<*mut ()>) -> LeakSizes {
        let mut sizes = LeakSizes::EMPTY;
        if !self.checks_objects() {
            return sizes;
        }
        let slot = cache.cache.geometry().size;
        if slot < HEAD {
            // Too small for a header: no checked object is served here.
            return sizes;
        }
        cache.cache.for_each_allocated(|s, o, _| {
            if owner.is_some_and(|k| k != o) {
                return;
            }
            let (t, n, _) = words(s);
            // `s` is a slot of `cache` out of its slab, at least
            // `HEAD` bytes (checked above), so its first words are
            // readable; a slot that holds no checked object has no live
            // tag of its own address and slab there. Their owners write
            // them meanwhile, atomically where they are aligned
            // (`word_store_shared`): a slot aligned to less than a word
            // (the 4-byte-aligned class, objects of up to 4 bytes) is not
            // read, nor counted (a review found Miri reporting the race
            // of plain reads here with an allocation on another thread).
            // The size is read between two reads of the tag, as a seqlock
            // reader would: an allocation writes the size before the tag,
            // a free the tag before it overwrites the size with its owner
            // word (each with a `Release` fence between), so a size read
            // between two live tags is that object's (short of the slot
            // being freed, quarantined, let out and allocated again
            // between the two reads).
            // SAFETY: as just said, the reads are in bounds, every write
            // they may race is atomic, and the tag check tells a live
            // checked object.
            unsafe {
                let live = Some(tag(ALIVE, s, slot, cache.cache.birth_of(s)));
                if word_load_if_aligned(t) == live {
                    crate::sync::shared_acquire_fence();
                    let size = word_load_if_aligned(n);
                    crate::sync::shared_acquire_fence();
                    if let Some(size) = size
                        && word_load_if_aligned(t) == live
                    {
                        sizes.add(size, s.addr());
                    }
                }
            }
        });
        sizes
    }
}
