//! Objects charged one by one: a group's objects of an accounted cache
//! come from that cache's charged cache (see `charged`), whose slabs every
//! group shares, and each is charged to its group in bytes, its stride.
//!
//! Counters count pages, so bytes reach a group's counter through stocks
//! (Linux's `obj_stock`): a slot's stock holds bytes charged to one group
//! beyond what its objects use. A charge takes from the stock if it holds
//! the group and enough; else it charges whole pages (reclaiming if a
//! limit refuses, as a slab grow does) and leaves the rest of them in the
//! stock, displacing the group there before. A free gives its bytes to the
//! stock, displacing another group's if the stock holds one; either way
//! the stock keeps less than a page and the whole pages past that are
//! flushed (a free of up to 16 KiB would otherwise leave them charged for
//! no object), and a displaced stock is flushed whole. A flush adds bytes
//! to the group's `spare` and uncharges the whole pages that makes.
//!
//! Per group, always: pages charged for objects (`obj_pages`, as pages of
//! the counter) = bytes of its live objects + bytes in stocks + `spare`.
//! So a group with no object left has nothing charged once its stocks are
//! flushed (removal, reclaim and `shrink` flush them), and `spare` is
//! under a page then.
//!
//! These charges stop below the root: the root's counter counts the
//! charged caches' slabs instead, as pages, so it stays what the page
//! source gave (see the crate docs, *Charging*).
//!
//! **Lifetime.** While `obj_pages` is not zero the group holds a reference
//! for them, so a removed group lives until its last object is freed. A
//! stock holding bytes of a group keeps it alive through those bytes; one
//! holding none may name a freed group, and is only compared, never
//! followed. A flush adds its bytes to the group's spare and takes the
//! whole pages out in one compare-and-swap, so it never reads the group
//! after its bytes are in (another flush may release the last page then).
//!
//! **Removal.** `remove` marks the group offline, then (a full fence
//! later) takes its stocks from every slot that ever held one. A charge or
//! free that puts an online group into a stock checks, a full fence after,
//! that it is still online, and takes the stock back if not: either the
//! removal sees the stock or the holder sees the removal (Dekker; loom
//! checks it in `tests::loom_tree`). So a removal leaves only its live
//! objects' pages charged. Frees after it put the removed group's bytes
//! into their slot's stock as a live group's (seed 001: the frees of a
//! dead tenant's objects cost what a live one's do, with no atomic
//! operation each); the stock keeps them, and the group, until another
//! group takes the slot's stock, a reclaim or `shrink` drains every
//! stock, or a reap drains the stocks holding removed groups' bytes
//! ([`Tree::drain_dead_stocks`]; decay runs one once a second). At most a
//! page per slot: Linux's per-CPU `obj_stock` keeps a dying cgroup's
//! `obj_cgroup` the same way until the CPU's stock drains.

use lock_api::RawMutex;

use super::Tree;
use crate::cgroup::Group;
use crate::error::Error;
use crate::magazine::{Env, Stock};
use crate::platform::PAGE_SIZE;
use crate::sync::{Ordering, fence};

impl<R: RawMutex> Tree<R> {
    /// Charges an object of `n` bytes (at most a size class) to `g`, a
    /// live group of this tree, from the stock of `slot`, which the caller
    /// holds; `false` (nothing done) if the stock cannot (then
    /// [`Tree::charge_object_slow`]).
    ///
    /// # Safety
    ///
    /// The caller holds `slot`.
    #[inline(always)]
    pub(crate) unsafe fn stock_take_at(&self, slot: usize, g: &Group<R>, n: usize) -> bool {
        let key = g.key();
        // SAFETY: forwarded.
        unsafe {
            self.stocks.under(slot, |s| {
                let hit = s.owner == key && s.bytes >= n;
                if hit {
                    s.bytes -= n;
                }
                hit
            })
        }
    }

    /// An object charge the slot's stock cannot serve: from the group's
    /// spare, else whole pages charged (reclaiming if a limit refuses),
    /// their rest left in the stock; then the group's `high`.
    #[cold]
    #[inline(never)]
    pub(crate) fn charge_object_slow<E: Env<R>>(&self, env: &E, g: &Group<R>, n: usize) -> Result<(), Error> {
        if take_spare(g, n) {
            return Ok(());
        }
        let pages = n.div_ceil(PAGE_SIZE);
        self.charge_below(env, g, pages, self.root.counter())?;
        self.got_obj_pages(g, pages);
        let rest = pages * PAGE_SIZE - n;
        if rest > 0 {
            self.stash(env, g, rest);
        }
        // `high` may call shrinkers and the event hook: if one unwinds,
        // the charge goes back.
        let undo = UnchargeOnUnwind { tree: self, env, g, n };
        self.over_high(env, g);
        core::mem::forget(undo);
        Ok(())
    }

    /// Uncharges an object of `n` bytes from its group, `owner` (the key
    /// its owner word holds): under the caller's slot when it gets one
    /// ([`Tree::stock_give_at`]), else to the group's spare.
    pub(crate) fn uncharge_object<E: Env<R>>(&self, env: &E, owner: *mut (), n: usize) {
        // SAFETY: the closure runs under the hold of `slot`.
        if self.stocks.with_slot(env, |slot| unsafe { self.stock_give_at(slot, owner, n) }).is_none() {
            // SAFETY: the object's `n` bytes are still charged to its
            // group, which they keep alive.
            self.flush(unsafe { &*owner.cast::<Group<R>>() }, n);
        }
    }

    /// Uncharges an object of `n` bytes from its group, `owner`, under the
    /// hold of `slot`: into the slot's stock when it holds the group's and
    /// stays within a page (inline), else [`Tree::give_slow_at`].
    ///
    /// # Safety
    ///
    /// The caller holds `slot`.
    #[inline(always)]
    pub(crate) unsafe fn stock_give_at(&self, slot: usize, owner: *mut (), n: usize) {
        // SAFETY: forwarded.
        if !unsafe { self.stock_add_at(slot, owner, n) } {
            // SAFETY: forwarded.
            unsafe { self.give_slow_at(slot, owner, n) }
        }
    }

    /// The inline part of [`Tree::stock_give_at`]: adds `n` bytes of
    /// `owner`'s to the stock of `slot` if it holds `owner`'s and stays
    /// within a page; `false` (nothing done) if not.
    ///
    /// # Safety
    ///
    /// The caller holds `slot`.
    #[inline(always)]
    pub(crate) unsafe fn stock_add_at(&self, slot: usize, owner: *mut (), n: usize) -> bool {
        // SAFETY: forwarded.
        unsafe {
            self.stocks.under(slot, |s| {
                let fits = s.owner == owner && s.bytes + n <= PAGE_SIZE;
                if fits {
                    s.bytes += n;
                }
                fits
            })
        }
    }

    /// [`Tree::stock_give_at`] when the stock does not hold the group, or
    /// would go past a page. Still under the hold of `slot`: what it does
    /// is lock-free and calls nothing outside the allocator (flushes,
    /// counter uncharges, a group's last reference pushed on the zombie
    /// stack). A stock past a page flushes its whole pages; another
    /// group's stock is flushed and replaced. A removed group's bytes go
    /// into the stock as a live group's do, so its next frees on this
    /// slot take no atomic either (seed 001); a live group is checked
    /// still online after a full fence (see the module docs, *Removal*).
    ///
    /// # Safety
    ///
    /// The caller holds `slot`.
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn give_slow_at(&self, slot: usize, owner: *mut (), n: usize) {
        // SAFETY: the object's `n` bytes are still charged to its group,
        // which they keep alive.
        let g = unsafe { &*owner.cast::<Group<R>>() };
        let online = !g.is_offline();
        // SAFETY: forwarded.
        unsafe { self.put_at(slot, g, n, online) }
    }

    /// Puts `n` bytes charged to `g` into the stock of `slot`, which the
    /// caller holds: added to it if it holds `g`'s, else in place of the
    /// stock there, which is flushed; either way the stock keeps less than
    /// a page and `g`'s whole pages past that are flushed (a free of up to
    /// 16 KiB, the largest class, would otherwise leave a group, a removed
    /// one too, with pages charged for no object). If `g` was `online`
    /// when the caller looked, then, a full fence later, `g` is checked
    /// still online, and the stock taken back if not (see the module docs,
    /// *Removal*); a removed group's stock stays. Lock-free; calls nothing
    /// outside the allocator.
    ///
    /// # Safety
    ///
    /// The caller holds `slot`.
    unsafe fn put_at(&self, slot: usize, g: &Group<R>, n: usize, online: bool) {
        let owner = g.key();
        // SAFETY: forwarded.
        let (out, pages, swapped) = unsafe {
            self.stocks.under(slot, |s| {
                if s.owner == owner {
                    s.bytes += n;
                    let keep = s.bytes % PAGE_SIZE;
                    let out = Stock { owner, bytes: s.bytes - keep };
                    s.bytes = keep;
                    (out, 0, false)
                } else {
                    let keep = n % PAGE_SIZE;
                    (core::mem::replace(s, Stock { owner, bytes: keep }), n - keep, true)
                }
            })
        };
        self.flush_stock(out);
        if swapped && online {
            // Pairs with the fence in `remove`. `g` is alive: `pages` are
            // still charged to it.
            fence(Ordering::SeqCst);
            if g.is_offline() {
                // SAFETY: forwarded.
                let back =
                    unsafe { self.stocks.under(slot, |s| if s.owner == owner { s.take() } else { Stock::EMPTY }) };
                self.flush_stock(back);
            }
        }
        // Last: once flushed, these bytes no longer keep `g` alive.
        if pages != 0 {
            self.flush(g, pages);
        }
    }

    /// Puts `bytes` charged to `g` beyond its objects into the slot's
    /// stock ([`Tree::put_at`]), or its spare without a slot.
    fn stash<E: Env<R>>(&self, env: &E, g: &Group<R>, bytes: usize) {
        // SAFETY: the closure runs under the hold of `slot`.
        if self.stocks.with_slot(env, |slot| unsafe { self.put_at(slot, g, bytes, true) }).is_none() {
            self.flush(g, bytes);
        }
    }

    /// Flushes a stock taken from a slot: its bytes go to its group's
    /// spare.
    pub(super) fn flush_stock(&self, s: Stock) {
        if s.bytes != 0 {
            // SAFETY: the stock's bytes are charged to its group, which
            // they keep alive.
            self.flush(unsafe { &*s.owner.cast::<Group<R>>() }, s.bytes);
        }
    }

    /// Adds `bytes` charged to `g` to its spare, uncharging the whole
    /// pages it then holds, in one compare-and-swap: until it succeeds the
    /// bytes are the caller's, still charged, so `g` is alive for every
    /// attempt; once it succeeds the caller reads `g`'s spare no more (a
    /// thread that took the last page may free the group then), and pages
    /// it took keep `g` alive until `lost_obj_pages`. A removed group's
    /// frees come here one by one, so it takes no read guard.
    fn flush(&self, g: &Group<R>, bytes: usize) {
        let mut s = g.spare.load(Ordering::Relaxed);
        loop {
            let sum = s + bytes;
            match g.spare.compare_exchange_weak(s, sum % PAGE_SIZE, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        let pages = (s + bytes) / PAGE_SIZE;
        if pages > 0 {
            g.counter.uncharge_below(pages, self.root.counter());
            self.lost_obj_pages(g, pages);
        }
    }

    /// Takes every stock holding `g` from the slots (a removal).
    pub(super) fn drain_stocks_of<E: Env<R>>(&self, env: &E, g: &Group<R>) {
        let key = g.key();
        self.stocks.drain(env, true, |s| s.owner == key, |s| self.flush_stock(s));
    }

    /// Stocks drains have taken and not yet flushed (see
    /// [`Stocks::in_transit`](crate::magazine::Stocks::in_transit)).
    pub(crate) fn stocks_in_transit(&self) -> usize {
        self.stocks.in_transit()
    }

    /// Takes the stocks that hold bytes of removed groups (a reap): the
    /// frees of a removed group's last objects leave their bytes there, and
    /// with them the group. A slot held now is passed over (a reap waits
    /// for nobody; see `reap_slots`): the next reap takes its stock.
    pub(crate) fn drain_dead_stocks<E: Env<R>>(&self, env: &E) {
        self.stocks.drain(
            env,
            false,
            |s| {
                if s.bytes == 0 {
                    // It may name a freed group: only compared, never followed.
                    return false;
                }
                // SAFETY: a stock's bytes are charged to its group, which
                // they keep alive; the drain holds the slot while it looks.
                let g = unsafe { &*s.owner.cast::<Group<R>>() };
                #[cfg(loom)]
                assert!(!g.is_freed(), "a drain followed a freed group");
                g.is_offline()
            },
            |s| self.flush_stock(s),
        );
    }

    /// Takes every slot's stock, whatever its group (reclaim, `shrink`).
    pub(crate) fn drain_all_stocks<E: Env<R>>(&self, env: &E) {
        self.stocks.drain(env, true, |_| true, |s| self.flush_stock(s));
    }

    /// Slots whose stock is in a state no path may leave it in: a null
    /// owner, or bytes with no owner (`magazine::NO_OWNER`). Each slot is
    /// looked at through its handshake; the stocks stay as they are.
    #[cfg(test)]
    pub(crate) fn bad_stocks<E: Env<R>>(&self, env: &E) -> usize {
        let mut bad = 0;
        self.stocks.peek_all(env, |s| {
            if s.owner.is_null() || (s.owner == Stock::EMPTY.owner && s.bytes != 0) {
                bad += 1;
            }
        });
        bad
    }

    /// Pages charged to `g` for objects (a snapshot).
    #[cfg(any(test, feature = "paranoid"))]
    pub(crate) fn obj_pages(&self, g: &Group<R>) -> usize {
        g.obj_pages.load(Ordering::Relaxed)
    }

    /// Bytes of `g`'s object pages that neither its objects nor a stock
    /// hold (a snapshot).
    #[cfg(any(test, feature = "paranoid"))]
    pub(crate) fn obj_spare(&self, g: &Group<R>) -> usize {
        g.spare.load(Ordering::Relaxed)
    }

    /// Counts `pages` newly charged to `g` for objects.
    fn got_obj_pages(&self, g: &Group<R>, pages: usize) {
        if g.obj_pages.fetch_add(pages, Ordering::AcqRel) == 0 {
            // The charging caller holds a reference, so `g` is live.
            g.get();
        }
    }

    /// Counts `pages` of `g` uncharged; the last one drops the reference.
    fn lost_obj_pages(&self, g: &Group<R>, pages: usize) {
        if g.obj_pages.fetch_sub(pages, Ordering::AcqRel) == pages {
            self.put_group(g);
        }
    }
}

/// Takes `n` bytes from `g`'s spare if it holds that many.
fn take_spare<R: RawMutex>(g: &Group<R>, n: usize) -> bool {
    let mut s = g.spare.load(Ordering::Relaxed);
    while s >= n {
        match g.spare.compare_exchange_weak(s, s - n, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => s = now,
        }
    }
    false
}

/// Gives a charge back if the `high` check after it unwinds.
struct UnchargeOnUnwind<'a, R: RawMutex, E: Env<R>> {
    tree: &'a Tree<R>,
    env: &'a E,
    g: &'a Group<R>,
    n: usize,
}

impl<R: RawMutex, E: Env<R>> Drop for UnchargeOnUnwind<'_, R, E> {
    fn drop(&mut self) {
        self.tree.uncharge_object(self.env, self.g.key(), self.n);
    }
}
