//! The header at the start of every checked slot (see the layout in the
//! parent module): where its words are, the tags, and where a freed
//! slot's object started.

use lock_api::RawMutex;

use super::{HEAD, W};
use crate::magazine::MagCache;

/// Where a slot's header words are: the tag, the size (live) or owner
/// (freed), and the quarantine link (freed).
#[inline]
pub(super) fn words(s: *mut u8) -> (*mut usize, *mut usize, *mut *mut u8) {
    (s.cast(), s.wrapping_add(W).cast(), s.wrapping_add(2 * W).cast())
}

/// The tag of the slot at `s` of `slot` bytes in state `kind`, in the
/// slab born `birth` (0: a page run).
#[inline]
pub(super) fn tag(kind: usize, s: *mut u8, slot: usize, birth: u32) -> usize {
    kind ^ s.addr() ^ slot.rotate_left(usize::BITS / 2) ^ (birth as usize).rotate_left(usize::BITS / 4)
}

/// The birth number of the slab of `p`, an object of `cache`, or 0 for
/// a page run (`None`).
///
/// # Safety
///
/// `p` is a live object of `cache`.
pub(super) unsafe fn birth_in<R: RawMutex>(cache: Option<&MagCache<R>>, p: *mut u8) -> u32 {
    // SAFETY: forwarded.
    cache.map_or(0, |c| unsafe { c.cache.birth_of(p) })
}

/// The offset of the object in a freed slot (its fourth word), for
/// reports; `HEAD + W` if that word does not hold a plausible one.
///
/// # Safety
///
/// `s` is a slot of `slot` bytes freed by [`Kmem::quarantine`].
pub(super) unsafe fn freed_front(s: *mut u8, slot: usize) -> usize {
    // SAFETY: per the contract, inside the slot.
    let f = unsafe { s.add(HEAD).cast::<usize>().read_unaligned() };
    if f.is_power_of_two() && f >= HEAD + W && f < slot { f } else { HEAD + W }
}
