//! Reclaim: shrinkers, subtree reclaim in passes and rounds, `high`
//! throttling, and soft-limit reclaim under contention, all honouring
//! `min` and `low` protection.
//!
//! Reclaim of a group subtree has a goal (the pages a refused charge needs,
//! plus a batch of 1/32 of the group's usage so the next charges do not
//! all reclaim, as Linux reclaims at least `SWAP_CLUSTER_MAX` pages) and
//! runs in rounds: drain the subtree's magazines, free its empty slabs and
//! stocks (under the tree lock), then call the shrinkers for the group on
//! every node (with no allocator lock held), asking for a growing share of
//! what they hold: 1/64, 1/16, 1/4, then all (Linux scans at rising
//! priority), but no more objects than the rest of the goal needs at the
//! pages per object the round before freed; a last round asks for all
//! without that bound. It stops as soon as the goal is met; a round whose
//! shrinkers hold nothing in scope ends it, and there are at most
//! [`ROUNDS`]: with nothing reclaimable, reclaim terminates after one
//! round (seed 002's swapoff case).
//!
//! Every reclaim honours protection (see `protection`): its rounds form a
//! first pass that takes nothing from groups within their effective `min`
//! or `low`; only if that pass fell short and passed a group over for its
//! `low` does a second pass run, taking from groups within their `low`
//! (a `low` event each) but never from one within its `min`. A subtree
//! with protected groups in it is reclaimed group by group (shrinkers see
//! [`ShrinkControl::own_only`]); one without, in one call per shrinker.
//!
//! Under contention (the page source is exhausted, or root usage crosses
//! the contention mark), the group with the largest excess over its soft
//! limit is reclaimed first, then the next, until the contention is over
//! or no group over its soft limit frees anything; then every group not
//! protected; then, if a group was passed over for its `low`, every group
//! not protected by `min`. The candidates are found by a scan of the
//! groups when contention strikes, not kept sorted on the fast path (seed
//! 002's RB-tree): contention is rare and the scan takes no lock.
//!
//! | file | holds |
//! | --- | --- |
//! | `reclaim.rs` | charging with reclaim, subtree reclaim passes, the drain-and-shrink every reclaim, `shrink` and `reap` use |
//! | `shrinkers` | the shrinker list, [`ShrinkControl`], [`GroupId`], a round's calls |
//! | `throttle` | `high`: reclaim, then the throttle delay |
//! | `contention` | contention episodes and their steps |

mod contention;
mod shrinkers;
mod throttle;

pub(crate) use shrinkers::Shrinkers;
pub use shrinkers::{GroupId, ShrinkControl, Shrinker};
#[cfg(all(test, not(loom)))]
pub(crate) use throttle::delay;
pub use throttle::{HIGH_DELAY_BATCH, HIGH_DELAY_MAX_NS, HIGH_DELAY_MIN_NS, HIGH_DELAY_NS};

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::Tree;
use super::protection::{Pass, Take};
use crate::cgroup::{ATOMIC, Event, Group, RECLAIM_OVERDRAFT, RECLAIMING, in_callback};
use crate::counter::PageCounter;
use crate::error::{Error, GroupName};
use crate::magazine::{Acct, Env, MagCache, drain_many, reap_slots};
use crate::platform::{PAGE_SIZE, Platform};
use crate::slab::{Cache, GrowError, Pages};
use crate::sync::Ordering;
use shrinkers::Goal;

/// The most rounds one pass of a subtree reclaim runs.
const ROUNDS: usize = 5;
/// The share of what they hold that shrinkers are asked for, round by
/// round; all rounds but the last also ask for no more than the goal
/// needs.
const SHARES: [usize; ROUNDS] = [64, 16, 4, 1, 1];

impl<R: RawMutex> Tree<R> {
    /// Charges `pages` to `g`'s counter (root's for null) and every
    /// ancestor's below `stop` (an ancestor's counter, or null: all of
    /// them), reclaiming and retrying once if a limit refuses. Returns the
    /// counter charged. Leaving `stop` and the levels above it alone is
    /// what objects charged one by one take (see `objects`), with `stop`
    /// the root's counter.
    pub(crate) fn charge_below<E: Env<R>>(
        &self,
        env: &E,
        g: *const Group<R>,
        pages: usize,
        stop: *const PageCounter,
    ) -> Result<&PageCounter, Error> {
        self.charge_as(env, g, pages, stop, true).map(|(c, _)| c)
    }

    /// [`Tree::charge_below`] of every level, for pages still to be
    /// found (a large object's run): no watermark notes it until the
    /// caller, holding the pages, calls [`PageCounter::note_charged`]
    /// with the overdraft returned (0, or [`RECLAIM_OVERDRAFT`] for a
    /// callback's charge past a `max`); given back, it shows in no peak
    /// of its own (a request no page source could meet, 1 EiB, showed as
    /// a peak of 1 EiB). Another charge at the same level meanwhile may
    /// still see it in the usage it notes, as it would see any charge in
    /// flight.
    pub(crate) fn charge_pending<E: Env<R>>(
        &self,
        env: &E,
        g: *const Group<R>,
        pages: usize,
    ) -> Result<(&PageCounter, usize), Error> {
        self.charge_as(env, g, pages, core::ptr::null(), false)
    }

    /// [`Tree::charge_below`], noting watermarks if `note`; with the
    /// overdraft the charge took.
    fn charge_as<E: Env<R>>(
        &self,
        env: &E,
        g: *const Group<R>,
        pages: usize,
        stop: *const PageCounter,
        note: bool,
    ) -> Result<(&PageCounter, usize), Error> {
        // SAFETY: callers pass a live group of this tree or null.
        let counter = if g.is_null() { &self.root.counter } else { unsafe { &(*g).counter } };
        let try_charge = |extra| {
            if note {
                counter.try_charge_below(pages, extra, stop)
            } else {
                counter.try_charge_pending(pages, extra, true, stop)
            }
        };
        let Err(k) = try_charge(0) else { return Ok((counter, 0)) };
        if in_callback(env.plat()) {
            // A callback's charge: overdrawn, or refused (no reclaim).
            return match try_charge(RECLAIM_OVERDRAFT) {
                Ok(()) => {
                    self.overdrawn(k, pages);
                    Ok((counter, RECLAIM_OVERDRAFT))
                }
                Err(k) => Err(self.refused(env, GrowError::Limit(k))),
            };
        }
        self.reclaim_refuser(env, k, pages);
        try_charge(0).map(|()| (counter, 0)).map_err(|k| self.refused(env, GrowError::Limit(k)))
    }

    /// Counts an overdraft of `pages` in the group whose counter `k`
    /// refused them within its `max`.
    fn overdrawn(&self, k: *const PageCounter, pages: usize) {
        // SAFETY: every counter that refuses a charge is a group's.
        let g = unsafe { self.group_of_counter(k) };
        g.events.overdrafts.add(1);
        g.events.overdraft_pages.add(pages);
    }

    /// A slab for `cache` in a callback of the allocator, whose grow a
    /// `max` refused at counter `k`: charged up to [`RECLAIM_OVERDRAFT`]
    /// pages past the `max` of each level (through the shared path, no
    /// stock), or refused.
    fn grow_overdrawn<E: Env<R>>(
        &self,
        env: &E,
        cache: &MagCache<R>,
        k: *const PageCounter,
    ) -> Result<NonNull<u8>, Error> {
        let mut pages = cache.pages(env, None);
        pages.overdraft = RECLAIM_OVERDRAFT;
        match cache.cache.alloc(&pages, 0) {
            Ok(p) => {
                self.overdrawn(k, cache.cache.geometry().slab_pages());
                Ok(p)
            }
            Err(e) => Err(self.refused(env, e)),
        }
    }

    /// A cache could not grow: for a refused charge, reclaim the refusing
    /// group's subtree and retry once; for an exhausted page source,
    /// reclaim step by step (groups over their soft limits first, then
    /// every group not protected) until the request can be met. The error
    /// names the group whose limit held.
    #[cold]
    #[inline(never)]
    pub(crate) fn grow_failed<E: Env<R>>(
        &self,
        env: &E,
        cache: &MagCache<R>,
        e: GrowError,
    ) -> Result<NonNull<u8>, Error> {
        match e {
            GrowError::Limit(k) if in_callback(env.plat()) => return self.grow_overdrawn(env, cache, k),
            GrowError::Limit(k) => self.reclaim_refuser(env, k, cache.cache.geometry().slab_pages()),
            GrowError::OutOfMemory => {
                if let Some(p) = self.under_contention(env, || cache.alloc(env).ok()) {
                    return Ok(p);
                }
            }
        }
        cache.alloc(env).map_err(|e| self.refused(env, e))
    }

    /// Reclaims for a charge of `pages` that counter `k` refused.
    fn reclaim_refuser<E: Env<R>>(&self, env: &E, k: *const PageCounter, pages: usize) {
        // SAFETY: every counter that refuses a charge is a group's.
        let g = unsafe { self.group_of_counter(k) };
        self.event(env, g, Event::Max);
        self.reclaim(env, g, Self::reclaim_goal(g, pages));
    }

    /// The error for a charge that failed after reclaim, counted as an
    /// `oom` event of the group that refused it.
    fn refused<E: Env<R>>(&self, env: &E, e: GrowError) -> Error {
        match e {
            GrowError::OutOfMemory => Error::OutOfMemory,
            GrowError::Limit(k) => {
                // SAFETY: every counter that refuses a charge is a group's.
                let g = unsafe { self.group_of_counter(k) };
                self.event(env, g, Event::Oom);
                Error::LimitExceeded { group: GroupName(g.name), max: g.counter.max().saturating_mul(PAGE_SIZE) }
            }
        }
    }

    /// An object of an internal metadata cache (groups, charged caches); when
    /// the page source is exhausted, contention reclaim runs as for any
    /// allocation.
    pub(crate) fn alloc_meta<E: Env<R>>(&self, env: &E, cache: &Cache<R>) -> Option<NonNull<u8>> {
        let pages = Pages::plain(env.src());
        let mut alloc = || cache.alloc(&pages, 0).ok();
        // Other threads may take what each step frees before we retry, so
        // metadata (which everything else waits on) gets a few episodes.
        alloc().or_else(|| (0..8).find_map(|_| self.under_contention(env, &mut alloc)))
    }

    /// Reclaims `g`'s subtree for `g`'s own sake (its limits, or an
    /// explicit request) until about `want` pages came back, honouring
    /// the protection of the groups below it, not its own (see the module
    /// docs); returns the pages uncharged.
    pub(crate) fn reclaim<E: Env<R>>(&self, env: &E, g: &Group<R>, want: usize) -> usize {
        if reclaiming(env) {
            return 0;
        }
        // Objects waiting in the detection quarantine are charged and keep
        // their slabs: give them back first, so the drain below can free
        // those slabs (else a group at its max with nothing live fails).
        env.flush_deferred();
        // Progress is what the counter shows: pages drained from caches
        // that other charges refill at once are no progress.
        let start = g.counter.usage();
        if start > 0 && start <= g.counter.min() {
            // Its own limits breach a group's `min`.
            self.event(env, g, Event::Min);
        }
        let mut goal = Goal { counter: &g.counter, start, want, objects: 0, bounded: true };
        let mut pass = Pass::first();
        loop {
            self.reclaim_caches(env, g, g, &mut pass);
            for (round, share) in SHARES.into_iter().enumerate() {
                goal.bounded = round + 1 < ROUNDS;
                // A round may free nothing and still progress (a shrinker
                // rotating referenced objects): only an empty scope ends it.
                if goal.met() || self.run_shrinkers(env, g, g, &mut pass, share, Some(&mut goal)).1 == 0 {
                    break;
                }
                self.reclaim_caches(env, g, g, &mut pass);
            }
            if goal.met() || !pass.honour_low || !pass.low_skipped {
                return goal.freed();
            }
            pass = Pass::breaching_low();
            self.breaching_low(env, g, g);
        }
    }

    /// Counts a `low` event for each group of `target`'s subtree that a
    /// pass breaching `low`, in a reclaim rooted at `root`, takes from
    /// within its effective `low` (once per reclaim, before it takes).
    fn breaching_low<E: Env<R>>(&self, env: &E, root: &Group<R>, target: &Group<R>) {
        let _read = self.read_guard();
        Self::plan(root, target, &mut Pass::breaching_low(), |v, visit| {
            if visit.take != Take::Nothing && visit.within_low {
                self.event(env, v, Event::Low);
            }
        });
    }

    /// The goal of a reclaim after `g` refused a charge of `pages`: the
    /// charge, what callbacks overdrew past its `max` (see
    /// [`RECLAIM_OVERDRAFT`]), and a batch of 1/32 of its usage.
    fn reclaim_goal(g: &Group<R>, pages: usize) -> usize {
        let usage = g.counter.usage();
        pages.saturating_add(usage.saturating_sub(g.counter.max())).saturating_add(usage / 32)
    }

    /// After a magazine refill from `cache`: `high` (see
    /// [`Tree::over_high`]); above the contention mark, contention reclaim
    /// runs.
    pub(crate) fn after_refill<E: Env<R>>(&self, env: &E, cache: &MagCache<R>) {
        let Some(counter) = cache.counter(env) else { return };
        // SAFETY: every counter a cache charges is a group's.
        self.over_high(env, unsafe { self.group_of_counter(counter) });
        let mark = self.contention_mark.load(Ordering::Relaxed);
        if self.root.counter.usage() > mark {
            let over = || (self.root.counter.usage() <= mark).then_some(());
            self.under_contention(env, over);
        }
    }

    /// Empties the magazines of the caches `each` visits on every CPU and
    /// gives their empty slabs back: the one drain-and-shrink of every
    /// reclaim, removal, cache destruction, `shrink` and `reap`. Returns
    /// the pages uncharged.
    pub(crate) fn drain_and_shrink<E: Env<R>>(env: &E, each: impl Fn(&mut dyn FnMut(&MagCache<R>))) -> usize {
        drain_many(env, &each, None);
        let mut pages = 0;
        each(&mut |c| {
            if !c.idle() {
                pages += c.cache.shrink(&c.pages(env, None));
            }
        });
        pages
    }

    /// Gives back everything `g`'s subtree holds unused in its caches
    /// (magazines, empty slabs, stocks), whatever its protection: for the
    /// leak checks, which want only live objects left.
    pub(crate) fn reclaim_unused<E: Env<R>>(&self, env: &E, g: &Group<R>) -> usize {
        if reclaiming(env) {
            return 0;
        }
        let _tree = self.lock.lock();
        let _read = self.read_guard();
        let mut pages = Self::drain_and_shrink(env, |f| g.walk_subtree(|grp| self.own_caches(grp, f)));
        g.walk_subtree(|grp| pages += grp.counter.drain_stock());
        let before = g.counter.usage();
        self.drain_all_stocks(env);
        pages + before.saturating_sub(g.counter.usage())
    }

    /// Gives back what a pass of a reclaim rooted at `root` may take from
    /// `target`'s subtree (see `protection`) of what it holds unused in its
    /// caches: magazines, empty slabs, stocks. Returns the pages uncharged.
    /// (One step of [`Tree::reclaim`], which adds the shrinkers.)
    fn reclaim_caches<E: Env<R>>(&self, env: &E, root: &Group<R>, target: &Group<R>, pass: &mut Pass) -> usize {
        let _tree = self.lock.lock();
        let _read = self.read_guard();
        // Decide once what each group gives, in its `plan` (the drain
        // below walks the caches several times, and what it frees changes
        // the usages the decision reads); the tree lock keeps the plan
        // ours and the tree as planned.
        Self::plan(root, target, pass, |v, visit| v.plan.store(visit.take as u8, Ordering::Relaxed));
        let mut pages = Self::drain_and_shrink(env, |f| self.planned_caches(target, f));
        let mut any = false;
        Self::planned(target, |v, take| match take {
            Take::Nothing => {}
            Take::Own => {
                any = true;
                pages += v.counter.drain_stock()
            }
            Take::Subtree => {
                any = true;
                v.walk_subtree(|g| pages += g.counter.drain_stock())
            }
        });
        if any {
            // What the slots' stocks hold beyond live objects (theirs, and
            // other groups': a stock is cheap to refill).
            let before = target.counter.usage();
            self.drain_all_stocks(env);
            pages += before.saturating_sub(target.counter.usage());
        }
        pages
    }

    /// Calls `f` on each group of `target`'s subtree that the last
    /// [`Tree::plan`] reached, with what it takes from it. The caller holds
    /// the tree lock, as it did while planning.
    fn planned(target: &Group<R>, mut f: impl FnMut(&Group<R>, Take)) {
        target.walk_pruned(|v| {
            let take = Take::from_u8(v.plan.load(Ordering::Relaxed));
            f(v, take);
            take != Take::Subtree
        });
    }

    /// Calls `f` on every cache the last plan of `target`'s subtree takes
    /// from.
    fn planned_caches(&self, target: &Group<R>, f: &mut dyn FnMut(&MagCache<R>)) {
        Self::planned(target, |v, take| match take {
            Take::Nothing => {}
            Take::Own => self.own_caches(v, f),
            Take::Subtree => v.walk_subtree(|g| self.own_caches(g, f)),
        });
    }

    /// Calls `f` on every cache whose slabs charge `g` itself: the root's
    /// (a group's objects charge it in bytes, not through slabs).
    fn own_caches(&self, g: &Group<R>, f: &mut dyn FnMut(&MagCache<R>)) {
        if self.is_root(g) {
            self.root_caches(f);
        }
    }

    /// Calls `f` on the caches charging the root: its size classes, its
    /// accounted typed caches and the charged caches.
    pub(crate) fn root_caches(&self, f: &mut dyn FnMut(&MagCache<R>)) {
        self.base_caches(|c| {
            if c.acct == Acct::Root {
                f(c)
            }
        });
        self.for_each_charged(|_, c| f(c));
    }

    /// Calls `f` on the base caches: the size classes, then the typed
    /// caches.
    fn base_caches(&self, mut f: impl FnMut(&MagCache<R>)) {
        self.classes.iter().for_each(&mut f);
        self.for_each_desc(|d| f(&d.cache));
    }

    /// Calls `f` on every cache: base caches and charged caches.
    pub(crate) fn for_each_cache(&self, f: &mut dyn FnMut(&MagCache<R>)) {
        let _read = self.read_guard();
        self.base_caches(&mut *f);
        self.for_each_charged(|_, c| f(c));
    }

    /// Empties every magazine and every charge stock, gives every empty
    /// slab back, and reclaims what groups and caches wait for it. Returns
    /// the pages given back.
    pub(crate) fn shrink<E: Env<R>>(&self, env: &E) -> usize {
        let read = self.read_guard();
        let pages = Self::drain_and_shrink(env, |f| self.for_each_cache(f));
        self.drain_all_stocks(env);
        self.for_each_group_and_root(|g| {
            g.counter.drain_stock();
        });
        drop(read);
        self.finish_reclaim(env);
        self.release_charged(env);
        let plain = Pages::plain(env.src());
        for meta in [&self.charged_caches, &self.groups, &self.descriptors, &self.pressure_nodes] {
            meta.shrink(&plain);
        }
        pages
    }

    /// Bonwick's reap (see `Kmem::reap`): the magazines of the slots in
    /// `idle` and the depot magazines unused since the last reap go back
    /// to the slabs, and empty slabs to the page source.
    pub(crate) fn reap<E: Env<R>>(&self, env: &E, idle: &[bool; crate::platform::MAX_CPUS]) -> usize {
        reap_slots(env, |f| self.for_each_cache(f), idle);
        let mut pages = 0;
        self.for_each_cache(&mut |c| {
            if !c.idle() {
                c.reap_depots(env);
                pages += c.cache.shrink(&c.pages(env, None));
            }
        });
        self.drain_dead_stocks(env);
        self.finish_reclaim(env);
        pages
    }

    /// After caches gave back slabs: groups whose last reference went are
    /// reclaimed, and destroyed caches that still had slabs when their
    /// handle went and have none now are retired (skipped while a cache
    /// is being created or destroyed, or an object is on its way back
    /// from the quarantine: the next call gets them).
    pub(crate) fn finish_reclaim<E: Env<R>>(&self, env: &E) {
        let registry = self.registry_lock.try_lock();
        let mut limbo = self.lock.lock();
        if registry.is_some() && env.deferred_settled() {
            self.retire_dead_caches(&mut limbo);
        }
        self.reclaim_groups(env, &mut limbo);
    }
}

/// A reference on a group that a walk took (`try_get`), put back when
/// dropped: also when a shrinker called while it is held unwinds.
struct Held<'a, R: RawMutex> {
    tree: &'a Tree<R>,
    g: &'a Group<R>,
}

impl<R: RawMutex> Drop for Held<'_, R> {
    fn drop(&mut self) {
        self.tree.put_group(self.g);
    }
}

/// Whether the calling context may not reclaim: it runs shrinkers (an
/// allocation from inside one skips reclaim instead of re-entering it), or
/// it is in interrupt context, where allocations are atomic: no reclaim,
/// no shrinkers, no tree lock, no waiting; what the caches and the page
/// source have, within the limits, or a failure.
#[inline]
fn reclaiming<R: RawMutex, E: Env<R>>(env: &E) -> bool {
    env.plat().in_interrupt() || env.plat().current_group().addr() & (RECLAIMING | ATOMIC) != 0
}
