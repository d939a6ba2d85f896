//! Byte stocks: per slot, bytes already charged to one owner and not yet
//! used by its objects (Linux's per-CPU `obj_stock`).
//!
//! Objects charged one by one (see the `cgroup` layer) are charged in
//! bytes, but counters count pages: a slot's stock holds the rest of the
//! last page charged for its owner, so most charges and uncharges are a
//! compare and an add under the slot, with no atomic. Only the holder of a
//! slot touches its stock, as with its magazines; a drainer (a removal, a
//! reclaim) takes it through the same handshake
//! ([`Slots::begin_drain`](super::Slots)).
//!
//! This layer does not know what an owner is: a pointer the layers above
//! give (a group, never null, never [`NO_OWNER`]) and read back when they
//! flush a stock. An empty stock's owner is [`NO_OWNER`], not null: a free
//! whose object's owner word is null (an uncharged object, a double free)
//! then misses every stock with the one compare that tests the owner, and
//! the fast path tests nothing else for it.

use core::mem::offset_of;

use lock_api::RawMutex;

use super::Env;
use crate::platform::MAX_CPUS;
use crate::sync::{AtomicUsize, CellArray, Ordering, UnsafeCell, atomic_usize, formed_address, loom_const_fn, repeat};

/// The owner of an empty stock: no owner's key (keys are non-null and
/// aligned), and not null either (see the module docs). Only compared,
/// never followed.
pub(crate) const NO_OWNER: *mut () = core::ptr::dangling_mut::<u8>().cast();

/// One slot's stock: `bytes` charged to `owner` ([`NO_OWNER`]: none)
/// beyond what its objects use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stock {
    pub(crate) owner: *mut (),
    pub(crate) bytes: usize,
}

impl Stock {
    /// No owner, no bytes.
    pub(crate) const EMPTY: Stock = Stock { owner: NO_OWNER, bytes: 0 };

    /// Takes the stock's contents, leaving it empty.
    #[inline]
    pub(crate) fn take(&mut self) -> Stock {
        core::mem::replace(self, Stock::EMPTY)
    }
}

/// One slot's stock cell: 32 bytes, as the slot's handshake state and its
/// magazines are (see `SlotSync`), so one shift of the slot (none on
/// `Threads`) indexes all three on a grouped fast path.
#[repr(C, align(32))]
struct StockCell(UnsafeCell<Stock>);

// The stride of a slot's magazines and handshake state (see `SlotSync`).
#[cfg(all(target_pointer_width = "64", not(loom)))]
static_assertions::const_assert_eq!(size_of::<StockCell>(), 32);

impl core::ops::Deref for StockCell {
    type Target = UnsafeCell<Stock>;
    fn deref(&self) -> &UnsafeCell<Stock> {
        &self.0
    }
}

/// The stocks of every slot.
pub(crate) struct Stocks {
    cells: CellArray<StockCell, MAX_CPUS>,
    /// Bit `s` is set once slot `s` held a stock: drains visit only those.
    used: AtomicUsize,
    /// Stocks a drainer took and has not yet handed on: their bytes are
    /// still charged, in no slot (see [`Stocks::in_transit`]).
    taken: AtomicUsize,
}

// SAFETY: a slot's cell is touched only by the context holding the slot
// or by a drainer that completed the handshake (as `CpuMags`).
unsafe impl Sync for Stocks {}
// SAFETY: as above; nothing is tied to the creating thread.
unsafe impl Send for Stocks {}

impl Stocks {
    loom_const_fn! {
        /// Every stock empty.
        pub(crate) fn new() -> Self {
            Stocks {
                cells: CellArray::new(repeat!(StockCell(UnsafeCell::new(Stock::EMPTY)); MAX_CPUS)),
                used: atomic_usize(0),
                taken: atomic_usize(0),
            }
        }
    }

    /// Runs `f` with the caller's slot, held (claimed if need be), or
    /// `None` without one. `f` must not call out of the allocator or block.
    #[inline]
    pub(crate) fn with_slot<R: RawMutex, E: Env<R>, T>(&self, cx: &E, f: impl FnOnce(usize) -> T) -> Option<T> {
        let slot = cx.slots().hold(cx.plat())?;
        let r = f(slot);
        cx.slots().unhold(cx.plat(), slot);
        Some(r)
    }

    /// Runs `f` on slot `slot`'s stock, which the caller holds (a
    /// magazine fast path that charges under the same hold, see
    /// `MagCache::alloc_fast_charged`). `f` must not call out of the
    /// allocator or block.
    ///
    /// # Safety
    ///
    /// The caller holds `slot` (it came from the slot handshake, so it is
    /// below `MAX_CPUS`).
    #[inline(always)]
    pub(crate) unsafe fn under<T>(&self, slot: usize, f: impl FnOnce(&mut Stock) -> T) -> T {
        // The cell's address formed in a register (see `formed_address`):
        // a charge's load of `bytes` reads the last free's store of it.
        // Within `self`: `slot < MAX_CPUS` (the platform contract).
        let cell = formed_address!(self, slot * size_of::<StockCell>(), offset_of!(Self, cells));
        // SAFETY: element `slot` (< MAX_CPUS: the platform contract) of
        // the array at `cells`, as `self.cells.get_unchecked(slot)`.
        let cell = unsafe { &*cell.cast::<StockCell>() };
        cell.with_mut(|s| {
            // SAFETY: the caller holds the slot, so its stock is ours.
            let s = unsafe { &mut *s };
            let had = s.owner;
            let r = f(s);
            if had == NO_OWNER && s.owner != NO_OWNER {
                self.note(slot);
            }
            r
        })
    }

    #[cold]
    fn note(&self, slot: usize) {
        let bit = 1usize << slot;
        if self.used.load(Ordering::Relaxed) & bit == 0 {
            self.used.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Takes, through the handshake, every slot's stock that `want` picks
    /// (it sees the stock, owner and bytes, while no slot holds it), and
    /// hands each to `each` once no slot holds it any more. `each` runs
    /// with no slot held or drained. `wait`: wait out a holder's operation
    /// in progress; else pass a slot held now over
    /// ([`Slots::try_begin_drain`](super::Slots::try_begin_drain)).
    pub(crate) fn drain<R: RawMutex, E: Env<R>>(
        &self,
        cx: &E,
        wait: bool,
        want: impl Fn(&Stock) -> bool,
        mut each: impl FnMut(Stock),
    ) {
        let used = self.used.load(Ordering::Relaxed);
        for slot in (0..MAX_CPUS).filter(|s| used & (1 << s) != 0) {
            let stolen = if wait {
                cx.slots().begin_drain(cx.plat(), slot)
            } else {
                match cx.slots().try_begin_drain(cx.plat(), slot) {
                    Some(stolen) => stolen,
                    None => continue,
                }
            };
            let taken = self.cells[slot].with_mut(|s| {
                // SAFETY: the handshake (or the steal) gives us the slot.
                let s = unsafe { &mut *s };
                if s.owner != NO_OWNER && want(s) { s.take() } else { Stock::EMPTY }
            });
            if taken.owner != NO_OWNER {
                // Counted before the slot is let go, so a drainer that
                // visits the slot next and finds it empty sees it here.
                self.taken.fetch_add(1, Ordering::Relaxed);
            }
            cx.slots().end_drain(cx.plat(), slot, stolen);
            if taken.owner != NO_OWNER {
                each(taken);
                // Release: what `each` did (the bytes flushed, pages
                // uncharged) comes before a reader that sees the count
                // drop.
                self.taken.fetch_sub(1, Ordering::Release);
            }
        }
    }

    /// Every slot's stock (used or not), each seen through the slot's
    /// handshake and left as it is: for tests of what no path may leave
    /// in a stock.
    #[cfg(test)]
    pub(crate) fn peek_all<R: RawMutex, E: Env<R>>(&self, cx: &E, mut f: impl FnMut(Stock)) {
        for slot in 0..MAX_CPUS {
            let stolen = cx.slots().begin_drain(cx.plat(), slot);
            // SAFETY: the handshake (or the steal) gives us the slot.
            let seen = self.cells[slot].with_mut(|s| unsafe { *s });
            cx.slots().end_drain(cx.plat(), slot, stolen);
            f(seen);
        }
    }

    /// Stocks drainers have taken and not yet handed on (`Acquire`: once
    /// 0, what they did with them is seen). A caller that drained every
    /// slot and then sees 0 has every stock taken before its drain
    /// flushed: `Cgroup::check_empty` waits for it, so a reclaim in
    /// another thread cannot make an empty group look charged.
    pub(crate) fn in_transit(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The formed address of each slot's stock is the array's own.
    #[test]
    fn every_slot_s_stock_is_found_where_the_array_has_it() {
        let stocks = Stocks::new();
        for slot in 0..MAX_CPUS {
            // SAFETY: `slot < MAX_CPUS`, and no other thread touches
            // these stocks.
            let formed = unsafe { stocks.under(slot, core::ptr::from_mut) };
            assert_eq!(formed, stocks.cells[slot].with_mut(|s| s), "slot {slot}");
        }
    }
}
