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

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::Tree;
use super::protection::{Pass, Take, Visit};
use crate::cgroup::{Event, Group, RECLAIM_OVERDRAFT, RECLAIMING, TokenHead, callback_marks, in_callback};
use crate::counter::PageCounter;
use crate::error::{Error, GroupName};
use crate::magazine::{Acct, Env, MagCache, drain_many};
use crate::platform::{PAGE_SIZE, PageSource, Platform};
use crate::slab::{Cache, GrowError, Pages};
use crate::sync::Ordering;

/// Shrinkers a reclaim copies out of the list per hold of its lock.
const SHRINKER_CHUNK: usize = 8;

/// The registered shrinkers: a table in pages taken straight from the page
/// source (uncharged), doubled when full and kept for the allocator's
/// life; unregistering leaves a hole that the next registration takes.
/// Only touched under the tree's `shrinkers` lock.
pub(crate) struct Shrinkers {
    /// `cap` entries, the first `len` in use (holes are `None`).
    table: *mut Option<&'static dyn Shrinker>,
    cap: usize,
    len: usize,
}

// SAFETY: the table is owned memory, reached only under the lock.
unsafe impl Send for Shrinkers {}

impl Shrinkers {
    pub(super) const fn new() -> Self {
        Shrinkers { table: core::ptr::null_mut(), cap: 0, len: 0 }
    }

    /// The entries in use.
    fn entries(&mut self) -> &mut [Option<&'static dyn Shrinker>] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `table` holds `cap >= len` initialised entries, ours
        // while the lock is held.
        unsafe { core::slice::from_raw_parts_mut(self.table, self.len) }
    }

    /// Up to [`SHRINKER_CHUNK`] entries from index `from`, and the number
    /// of entries in use.
    fn chunk(&mut self, from: usize) -> ([Option<&'static dyn Shrinker>; SHRINKER_CHUNK], usize) {
        let mut out = [None; SHRINKER_CHUNK];
        let e = self.entries();
        if let Some(src) = e.get(from..) {
            let n = src.len().min(SHRINKER_CHUNK);
            out[..n].copy_from_slice(&src[..n]);
        }
        (out, e.len())
    }

    /// Adds `s` (once); `OutOfMemory` when the table is full and a larger
    /// one cannot be had.
    fn add<S: PageSource>(&mut self, src: &S, s: &'static dyn Shrinker) -> Result<(), Error> {
        if self.entries().iter().flatten().any(|x| core::ptr::addr_eq(*x, s)) {
            return Ok(());
        }
        if let Some(hole) = self.entries().iter_mut().find(|x| x.is_none()) {
            *hole = Some(s);
            return Ok(());
        }
        if self.len == self.cap {
            const ENTRY: usize = size_of::<Option<&'static dyn Shrinker>>();
            let cap = if self.cap == 0 { PAGE_SIZE / ENTRY } else { self.cap * 2 };
            let order = (cap * ENTRY / PAGE_SIZE).trailing_zeros();
            let run = src.alloc_pages(order, 0).ok_or(Error::OutOfMemory)?;
            let table = run.addr.as_ptr().cast::<Option<&'static dyn Shrinker>>();
            for i in 0..cap {
                // SAFETY: a fresh run of `cap` entries, ours, aligned for
                // them; entries below `len` copied from the old table.
                unsafe { table.add(i).write(if i < self.len { *self.table.add(i) } else { None }) };
            }
            if self.cap != 0 {
                let old = (self.cap * ENTRY / PAGE_SIZE).trailing_zeros();
                // SAFETY: the old table came from `src`, and is copied out.
                unsafe { src.free_pages(NonNull::new_unchecked(self.table.cast()), old) };
            }
            self.table = table;
            self.cap = cap;
        }
        // SAFETY: `len < cap`: an initialised entry of the table.
        unsafe { *self.table.add(self.len) = Some(s) };
        self.len += 1;
        Ok(())
    }

    /// Takes `s` out, leaving a hole.
    fn remove(&mut self, s: &'static dyn Shrinker) {
        for x in self.entries() {
            if x.is_some_and(|y| core::ptr::addr_eq(y, s)) {
                *x = None;
            }
        }
    }
}
/// The `high` throttle: the delay for [`HIGH_DELAY_BATCH`] pages charged
/// while the group stays above its `high`, after reclaim, by as much as
/// the `high` itself (at twice its `high`); in proportion to both the
/// pages and the excess (Linux scales its delay by the pages charged over
/// `high` too).
pub const HIGH_DELAY_NS: u64 = 20_000_000;
/// Pages charged per [`HIGH_DELAY_NS`] (Linux's `MEMCG_CHARGE_BATCH`).
pub const HIGH_DELAY_BATCH: usize = 64;
/// The longest `high` throttle delay of one allocation.
pub const HIGH_DELAY_MAX_NS: u64 = 100_000_000;
/// Delays shorter than this are not made (a sleep would cost about as
/// much as it holds back).
pub const HIGH_DELAY_MIN_NS: u64 = 50_000;

/// The throttle delay for `pages` charged while `excess` pages above a
/// `high` of `high` pages are left: [`HIGH_DELAY_NS`] per
/// [`HIGH_DELAY_BATCH`] pages and per `high` of excess, at most
/// [`HIGH_DELAY_MAX_NS`], none under [`HIGH_DELAY_MIN_NS`].
pub(crate) fn delay(excess: usize, high: usize, pages: usize) -> u64 {
    let scale = high.max(1) as u128 * HIGH_DELAY_BATCH as u128;
    let ns = (excess as u128).saturating_mul(pages as u128).saturating_mul(HIGH_DELAY_NS as u128) / scale;
    let ns = ns.min(HIGH_DELAY_MAX_NS as u128) as u64;
    if ns < HIGH_DELAY_MIN_NS { 0 } else { ns }
}

/// The most rounds one pass of a subtree reclaim runs.
const ROUNDS: usize = 5;
/// The share of what they hold that shrinkers are asked for, round by
/// round; all rounds but the last also ask for no more than the goal
/// needs.
const SHARES: [usize; ROUNDS] = [64, 16, 4, 1, 1];

/// Which groups a contention step picks from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Over their soft limit, largest excess first, not protected.
    Soft,
    /// Not protected by `min` or `low`, largest first.
    Unprotected,
    /// Not protected by `min`, largest first: Linux's second pass, once a
    /// group was passed over for its `low`.
    BreachLow,
}
/// One contention-reclaim episode: the groups it reclaimed carry its id
/// in `Group::visited`, so each is reclaimed once per episode however many
/// groups there are. Episodes of other threads may overwrite a mark; the
/// step bound ([`Episode::may_step`]) keeps an episode finite even then.
pub(crate) struct Episode {
    /// Where this episode started in the allocator's sequence (never 0;
    /// wraps after 2^32 episodes, when a stale mark costs one extra visit).
    id: u32,
    /// Where its [`Mode::BreachLow`] steps started (0: not yet): a group
    /// reclaimed earlier in the episode may be reclaimed once more there.
    breach: u32,
    /// Whether a group was passed over for its `low`.
    low_skipped: bool,
    /// Groups reclaimed so far.
    steps: usize,
    /// The most online groups a scan of this episode found.
    most_online: usize,
    /// Whether the root's own caches were reclaimed.
    root: bool,
}

impl Episode {
    /// Whether a group marked `mark` was reclaimed by this episode or one
    /// that started after it (concurrent episodes share their work instead
    /// of reclaiming the same largest group in turn).
    /// In [`Mode::BreachLow`], the marks from when its steps started count.
    fn done(&self, mark: u32, mode: Mode) -> bool {
        let since = if mode == Mode::BreachLow { self.breach } else { self.id };
        mark != 0 && mark.wrapping_sub(since) < (1 << 31)
    }

    /// The mark of a group reclaimed in `mode`.
    fn mark(&self, mode: Mode) -> u32 {
        if mode == Mode::BreachLow { self.breach } else { self.id }
    }

    /// Whether another group may be reclaimed: at most four times the
    /// most groups a scan of this episode found, plus one (each group once
    /// before and once after the episode breaches `low`, and once more
    /// each time another episode overwrote its mark), so an episode ends
    /// however the tree changes under it.
    fn may_step(&self) -> bool {
        self.steps <= self.most_online.saturating_mul(4).saturating_add(1)
    }
}

/// A group's identity for shrinkers: stable while the group has charged
/// objects. It holds the address of the group's token head (null for the
/// root) and is only compared, or followed up the tree by
/// [`ShrinkControl::contains`] once that has found the group among the
/// allocator's live groups: any id, even one of a group long freed (whose
/// address a new group may have taken since), is safe to pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupId(pub(crate) *const (), u32);

// SAFETY: a `GroupId` is an identity: nothing dereferences it except
// `ShrinkControl::contains`, after finding it among the tree's groups
// under a read guard, and groups are shared between threads anyway.
unsafe impl Send for GroupId {}
// SAFETY: as above; it has no interior mutability.
unsafe impl Sync for GroupId {}

impl GroupId {
    /// The root group.
    pub const ROOT: GroupId = GroupId(core::ptr::null(), u32::MAX);
}

/// What a shrinker is asked to shrink: objects on `node` charged to
/// `target` or to any of its descendants, or, when reclaim visits a
/// subtree with protected groups in it one group at a time
/// ([`ShrinkControl::own_only`]), to `target` alone. A shrinker finds
/// what is in scope with [`ShrinkControl::contains`].
pub struct ShrinkControl {
    target: GroupId,
    node: usize,
    own: bool,
    /// The `Tree<R>` whose shrinkers run, erased (shrinkers are not
    /// generic over the lock type), for `known`.
    tree: *const (),
    /// `Tree::<R>::knows` of that tree.
    known: unsafe fn(*const (), GroupId) -> bool,
}

impl ShrinkControl {
    /// The group being reclaimed.
    pub fn target(&self) -> GroupId {
        self.target
    }

    /// The node being reclaimed.
    pub fn node(&self) -> usize {
        self.node
    }

    /// Whether only objects of the target itself are in scope (and those
    /// of its removed descendants, which it inherits), not those of its
    /// live descendants: some of them are protected, and reclaim visits
    /// them on their own.
    pub fn own_only(&self) -> bool {
        self.own
    }

    /// Whether objects charged to `g` are in scope: `g` is the target or
    /// one of its descendants; with [`ShrinkControl::own_only`], `g` is the
    /// target or a removed group whose nearest live ancestor is the
    /// target. Any id may be passed: one that names no group of this
    /// allocator (freed since, or of another allocator) is out of scope,
    /// unless the target is the root and scope is not `own_only`, where
    /// every id is in. The target itself costs one comparison; another id
    /// a walk of the allocator's groups (to find it among them) and then
    /// of its ancestors.
    pub fn contains(&self, g: GroupId) -> bool {
        if g == self.target {
            return true;
        }
        if !self.own && self.target == GroupId::ROOT {
            return true;
        }
        // SAFETY: `tree` and `known` were set together from one live tree,
        // whose shrinker call this is (a `ShrinkControl` lives only as
        // long as that call, which holds a read guard of the tree).
        if !unsafe { (self.known)(self.tree, g) } {
            return false;
        }
        // From here on `g` names a group still linked in the tree, and the
        // read guard of this shrinker call keeps it (and its ancestors,
        // which its references keep linked) from being freed.
        if self.own {
            return self.owns(g);
        }
        let mut cur = g.0.cast::<TokenHead>();
        while !cur.is_null() {
            if core::ptr::eq(cur.cast(), self.target.0) {
                return true;
            }
            // SAFETY: `g` is linked in the tree (checked above), so live
            // while this shrinker call's read guard lasts, and a live
            // group's ancestors are live; every group's head names its
            // parent's head, whatever the lock type.
            cur = unsafe { (*cur).parent };
        }
        false
    }

    /// [`ShrinkControl::contains`] with [`ShrinkControl::own_only`], for a
    /// `g` found linked in the tree (or the root's null id).
    fn owns(&self, g: GroupId) -> bool {
        let mut cur = g.0.cast::<TokenHead>();
        loop {
            // SAFETY: `g` is live (found linked by `contains`, kept by the
            // call's read guard), and so are its ancestors; every group's
            // head names its parent's head and holds its state, whatever
            // the lock type.
            if cur.is_null() || !unsafe { (*cur).is_offline() } {
                break;
            }
            // SAFETY: as above.
            cur = unsafe { (*cur).parent };
        }
        if self.target == GroupId::ROOT {
            // The root's head is the one without a parent (its id is null).
            // SAFETY: as above.
            cur.is_null() || unsafe { (*cur).parent.is_null() }
        } else {
            core::ptr::eq(cur.cast(), self.target.0)
        }
    }
}

/// How far a reclaim with a goal has come: shrinkers are asked for about
/// what the rest of it needs, at the pages per object seen so far.
struct Goal<'a> {
    counter: &'a PageCounter,
    /// The counter's usage when the reclaim started.
    start: usize,
    /// Pages wanted.
    want: usize,
    /// Objects the shrinkers freed so far.
    objects: usize,
    /// Whether the shrinkers' requests are bounded by the goal (every
    /// round but the last).
    bounded: bool,
}

impl Goal<'_> {
    /// Pages the counter lost since the start.
    fn freed(&self) -> usize {
        self.start.saturating_sub(self.counter.usage())
    }

    fn met(&self) -> bool {
        self.freed() >= self.want
    }

    /// The most objects to ask a shrinker for: none once the goal is met,
    /// else the rest of the goal at the pages per object freed so far (no
    /// bound before anything was, or in the last round).
    fn bound(&self) -> usize {
        let freed = self.freed();
        if freed >= self.want {
            return 0;
        }
        if !self.bounded || self.objects == 0 || freed == 0 {
            return usize::MAX;
        }
        let rest = (self.want - freed) as u128;
        usize::try_from((rest * self.objects as u128).div_ceil(freed as u128)).unwrap_or(usize::MAX)
    }
}

/// How many of the `n` objects in scope to ask a shrinker for at `share`:
/// `n / share + 1`, but no more than the group's objects above the
/// protection `floor` honoured there (its usage `u` above `floor`, in
/// proportion, as if its objects were of one size; Linux scales its scan
/// the same way), nor than `bound`.
fn ask(n: usize, share: usize, u: usize, floor: usize, bound: usize) -> usize {
    let mut nr = (n / share).saturating_add(1);
    if floor > 0 && u > 0 {
        let over = u.saturating_sub(floor) as u128;
        let fair = usize::try_from((n as u128 * over).div_ceil(u as u128)).unwrap_or(usize::MAX);
        nr = nr.min(fair.max(1));
    }
    nr.min(bound)
}

/// A cache of objects that can be freed on demand (Linux's group- and
/// node-aware shrinkers): a dentry LRU, a connection pool.
///
/// Shrinkers are called with no allocator lock held, from whatever thread
/// is reclaiming; they may free objects (which is the point).
///
/// **Allocating.** A shrinker had better not allocate, but may (a list of
/// victims, say): its allocations never reclaim (reclaim does not re-enter
/// itself), and one that a group's `max` refuses is charged past it, by at
/// most [`RECLAIM_OVERDRAFT`] pages per group, and counted in the group's
/// [`GroupStat::overdrafts`](crate::GroupStat::overdrafts) (Linux's
/// `PF_MEMALLOC`), so a program does not abort for a failed allocation in
/// its shrinker. The limit holds on the way back: the allocation that
/// started the reclaim charges within `max` or fails, and the group's next
/// reclaim takes back what was overdrawn. Beyond the overdraft, or with
/// the page source exhausted, its allocations fail.
///
/// **Panicking.** A shrinker should not panic. If `count` or `scan`
/// panics and the panic unwinds (with `panic = abort` nothing does), the
/// reclaim that called it stops there and the panic goes on up the
/// allocation (or [`Cgroup::reclaim`](crate::Cgroup::reclaim),
/// [`Cgroup::set_max`](crate::Cgroup::set_max)) that reclaimed: the
/// thread's marks are restored, no allocator lock is held, the refused
/// charge was already taken back, and the allocation makes nothing; a
/// `catch_unwind` around it finds the allocator as before, and the
/// shrinker is called again by the next reclaim. Through `GlobalAlloc`,
/// which must not unwind, the panic aborts the program instead.
pub trait Shrinker: Sync {
    /// How many objects in scope could be freed. See the trait docs for
    /// what happens if it panics.
    fn count(&self, sc: &ShrinkControl) -> usize;
    /// Frees up to `nr` objects in scope; returns how many it freed. See
    /// the trait docs for what happens if it allocates or panics.
    fn scan(&self, sc: &ShrinkControl, nr: usize) -> usize;
}

impl<R: RawMutex> Tree<R> {
    /// Registers a shrinker; safe while reclaim runs (a reclaim in progress
    /// uses the entries it copied). Registering one twice is a no-op.
    pub(crate) fn register_shrinker<S: PageSource>(&self, src: &S, s: &'static dyn Shrinker) -> Result<(), Error> {
        self.shrinkers.lock().add(src, s)
    }

    /// Unregisters a shrinker; a reclaim already running may still call it
    /// once (it is `'static`, so that is safe).
    pub(crate) fn unregister_shrinker(&self, s: &'static dyn Shrinker) {
        self.shrinkers.lock().remove(s);
    }

    /// Sets the contention mark, in pages (see `Kmem::set_contention_mark`).
    pub(crate) fn set_contention_mark(&self, pages: usize) {
        self.contention_mark.store(pages, Ordering::Relaxed);
    }

    /// The identity shrinkers see for `g`.
    pub(crate) fn group_id(&self, g: &Group<R>) -> GroupId {
        GroupId(self.token(g), g.index())
    }

    /// Whether `id` is the root's or names a group linked in `tree`'s
    /// `all_groups` (not yet reclaimed): its index in the id table still
    /// names its address, so `id` is never followed to find out.
    ///
    /// # Safety
    ///
    /// `tree` points to a live `Tree<R>`.
    pub(crate) unsafe fn knows(tree: *const (), id: GroupId) -> bool {
        if id == GroupId::ROOT {
            return true;
        }
        // SAFETY: the caller's contract.
        let tree = unsafe { &*tree.cast::<Self>() };
        tree.ids.names(id.1, id.0)
    }

    /// Charges `pages` to `g`'s counter (root's for null), reclaiming and
    /// retrying once if a limit refuses. Returns the counter charged.
    pub(crate) fn charge<E: Env<R>>(&self, env: &E, g: *const Group<R>, pages: usize) -> Result<&PageCounter, Error> {
        // SAFETY: callers pass a live group of this tree or null.
        let counter = if g.is_null() { &self.root.counter } else { unsafe { &(*g).counter } };
        let Err(k) = counter.try_charge(pages) else { return Ok(counter) };
        if in_callback(env.plat()) {
            // A callback's charge: overdrawn, or refused (no reclaim).
            return match counter.try_charge_over(pages, RECLAIM_OVERDRAFT) {
                Ok(()) => {
                    self.overdrawn(k, pages);
                    Ok(counter)
                }
                Err(k) => Err(self.refused(env, GrowError::Limit(k))),
            };
        }
        self.reclaim_refuser(env, k, pages);
        counter.try_charge(pages).map(|()| counter).map_err(|k| self.refused(env, GrowError::Limit(k)))
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

    /// With the page source exhausted: runs contention reclaim a step at a
    /// time, calling `retry` after each, until it gives something or
    /// nothing is left to reclaim.
    pub(crate) fn under_contention<T, E: Env<R>>(&self, env: &E, mut retry: impl FnMut() -> Option<T>) -> Option<T> {
        if !reclaiming(env) {
            // As in `reclaim`: quarantined objects first, so the steps'
            // drains can give their slabs back.
            env.flush_deferred();
        }
        let mut episode = self.episode();
        while self.contention_step(env, &mut episode) {
            if let Some(x) = retry() {
                return Some(x);
            }
        }
        None
    }

    /// An object of an internal metadata cache (groups, child caches); when
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

    /// Calls every shrinker on every node for what a pass of a reclaim
    /// rooted at `root` may take from `target`'s subtree (see
    /// `protection`), without locks held; returns the objects they freed
    /// and the objects they held in scope. What a shrinker reports is
    /// clamped (a `scan` frees at most what it was asked for; sums
    /// saturate), so a shrinker that lies cannot make reclaim overflow or
    /// loop. While they run, the context's current group token carries
    /// the [`RECLAIMING`] and `MEMALLOC` tags: an allocation a shrinker
    /// makes charges as usual but skips reclaim, and may overdraw a `max`
    /// ([`RECLAIM_OVERDRAFT`]). A read guard keeps the groups the walk
    /// reaches from being freed meanwhile (it only defers freeing group
    /// metadata; nothing waits for it).
    fn run_shrinkers<E: Env<R>>(
        &self,
        env: &E,
        root: &Group<R>,
        target: &Group<R>,
        pass: &mut Pass,
        share: usize,
        mut goal: Option<&mut Goal<'_>>,
    ) -> (usize, usize) {
        // The first chunk is copied once; a reclaim with more shrinkers
        // than that copies the rest a chunk at a time, per group visited.
        let (first, len) = self.shrinkers.lock().chunk(0);
        let (mut freed, mut held) = (0usize, 0usize);
        if first.iter().all(Option::is_none) && len <= SHRINKER_CHUNK {
            return (0, 0);
        }
        let platform = env.plat();
        // The tagged token names the same group with the same reference,
        // so the platform slot's reference is untouched. The guards restore
        // the context's marks and release the read guard when the
        // shrinkers return or one of them unwinds (nothing else is held
        // across the calls, and `freed`, `held` and the goal are ours).
        let _marks = callback_marks(platform);
        {
            let _read = self.read_guard();
            Self::plan(root, target, pass, |v, Visit { take, floor, .. }| {
                if take == Take::Nothing {
                    return;
                }
                let id = self.group_id(v);
                let mut chunk = first;
                let mut next = SHRINKER_CHUNK;
                loop {
                    for s in chunk.iter().flatten() {
                        for node in 0..platform.nodes().max(1) {
                            let sc = ShrinkControl {
                                target: id,
                                node,
                                own: take == Take::Own,
                                tree: core::ptr::from_ref(self).cast(),
                                known: Self::knows,
                            };
                            // A share per round (at least one), as Linux scans
                            // at a priority rather than emptying a cache at once.
                            let n = s.count(&sc);
                            held = held.saturating_add(n);
                            let bound = goal.as_deref().map_or(usize::MAX, Goal::bound);
                            let nr = ask(n, share, v.counter.usage(), floor, bound);
                            if n > 0 && nr > 0 {
                                let got = s.scan(&sc, nr).min(nr);
                                freed = freed.saturating_add(got);
                                if let Some(g) = goal.as_deref_mut() {
                                    g.objects = g.objects.saturating_add(got);
                                }
                            }
                        }
                    }
                    if next >= len {
                        break;
                    }
                    (chunk, _) = self.shrinkers.lock().chunk(next);
                    next += SHRINKER_CHUNK;
                }
            });
        }
        (freed, held)
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

    /// After a charge to `g` (a magazine refill, a large object): an
    /// allocating task whose group (or an ancestor) is above `high`
    /// reclaims from that level before its allocation returns (it never
    /// fails for `high`); if a level stays above its `high`, the task is
    /// then delayed in proportion to the excess left and to the pages the
    /// level was charged above its `high` since its last delay ([`delay`];
    /// the largest of the levels'), through [`Platform::throttle`], and
    /// the level counts it. Never in atomic context (interrupts, atomic
    /// scopes, shrinkers, the event hook), where there was no reclaim
    /// either.
    pub(crate) fn over_high<E: Env<R>>(&self, env: &E, g: &Group<R>) {
        let mut worst: Option<(&Group<R>, u64)> = None;
        let mut level = Some(g);
        while let Some(l) = level {
            let high = l.counter.high();
            if l.counter.usage() > high {
                self.event(env, l, Event::High);
                let excess = l.counter.usage().saturating_sub(high);
                self.reclaim(env, l, Self::reclaim_goal(l, excess));
                let usage = l.counter.usage();
                if usage > high && !reclaiming(env) {
                    // Pages charged above `high` since the last delay.
                    let last = l.high_mark.swap(usage, Ordering::Relaxed);
                    let ns = delay(usage - high, high, usage.saturating_sub(last.max(high)));
                    if ns > worst.map_or(0, |(_, w)| w) {
                        worst = Some((l, ns));
                    }
                }
            }
            level = l.parent();
        }
        if let Some((l, ns)) = worst {
            l.events.throttled.add(1);
            l.events.throttled_us.add((ns / 1000) as usize);
            env.plat().throttle(ns);
        }
    }

    /// A new contention-reclaim episode.
    fn episode(&self) -> Episode {
        Episode { id: self.episode_id(), breach: 0, low_skipped: false, steps: 0, most_online: 0, root: false }
    }

    /// The next id of the episode sequence.
    fn episode_id(&self) -> u32 {
        // `Relaxed`: only uniqueness matters (an RMW gives it). Skips 0,
        // the mark of a group no episode reclaimed, after a wrap.
        let mut id = 0;
        while id == 0 {
            id = self.episodes.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        }
        id
    }

    /// One step of contention reclaim: reclaims the group with the largest
    /// excess over its soft limit, or if none is over, the largest group
    /// not protected, or if a group was passed over for its `low`, the
    /// largest not protected by `min`, or finally the root's own caches;
    /// each honours the protection of the groups below it. Groups this
    /// episode reclaimed (since it started breaching `low`, in that mode)
    /// are skipped, and the one reclaimed is marked. `false` when nothing
    /// was left to try, or from inside a shrinker.
    fn contention_step<E: Env<R>>(&self, env: &E, episode: &mut Episode) -> bool {
        if reclaiming(env) {
            return false;
        }
        for mode in [Mode::Soft, Mode::Unprotected, Mode::BreachLow] {
            if mode == Mode::BreachLow {
                // Linux's second pass: only once something was protected
                // by `low` alone.
                if !episode.low_skipped {
                    break;
                }
                if episode.breach == 0 {
                    episode.breach = self.episode_id();
                }
            }
            let Some(b) = self.candidate(episode, mode) else { continue };
            // Put back when the step ends, also if a shrinker unwinds.
            let _held = Held { tree: self, g: b };
            if !episode.may_step() {
                break;
            }
            // Contention reclaim takes a little at a time (1/16 of what
            // the shrinkers hold, one round) and lets the caller retry, so
            // groups settle near their soft limits instead of swinging.
            let mut pass = if mode == Mode::BreachLow { Pass::breaching_low() } else { Pass::first() };
            if mode == Mode::BreachLow {
                self.breaching_low(env, &self.root, b);
            }
            let mut pages = self.reclaim_caches(env, &self.root, b, &mut pass);
            let before = b.counter.usage();
            if self.run_shrinkers(env, &self.root, b, &mut pass, 16, None).0 != 0 {
                pages += before.saturating_sub(b.counter.usage());
            }
            episode.low_skipped |= pass.low_skipped;
            if mode == Mode::Soft {
                b.events.soft.add(1);
                b.events.soft_pages.add(pages);
            }
            // Mark it, unless a later episode already did (its mark covers
            // this one too). A race here costs a visit at most.
            if !episode.done(b.visited.load(Ordering::Relaxed), mode) {
                b.visited.store(episode.mark(mode), Ordering::Relaxed);
            }
            episode.steps += 1;
            return true;
        }
        if episode.root {
            return false;
        }
        episode.root = true;
        let _tree = self.lock.lock();
        Self::drain_and_shrink(env, |f| self.root_caches(f));
        self.root.counter.drain_stock();
        true
    }

    /// The group a contention step of `episode` in `mode` reclaims next,
    /// with a reference, among the online groups the episode has not
    /// reclaimed yet in that mode; protection is the groups' effective
    /// protection under the root. Notes in the episode when a group is
    /// passed over for its `low`.
    fn candidate(&self, episode: &mut Episode, mode: Mode) -> Option<&Group<R>> {
        let mut best: Option<&Group<R>> = None;
        let mut best_score = 0;
        let mut online = 0usize;
        self.for_each_group(|g| {
            if g.is_offline() {
                return;
            }
            online += 1;
            if episode.done(g.visited.load(Ordering::Relaxed), mode) {
                return;
            }
            let u = g.counter.usage();
            let e = Self::protection(&self.root, g);
            let score = if e.min != 0 && u <= e.min {
                0
            } else if mode != Mode::BreachLow && e.low != 0 && u <= e.low {
                episode.low_skipped = true;
                0
            } else if mode == Mode::Soft {
                u.saturating_sub(g.counter.soft())
            } else {
                u
            };
            // A group whose last reference is gone is not revived; the
            // candidate's reference keeps it alive past the iteration.
            if score > best_score && g.try_get() {
                if let Some(prev) = best {
                    self.put_group(prev);
                }
                // SAFETY: referenced just above, so it outlives the walk.
                best = Some(unsafe { &*(g as *const Group<R>) });
                best_score = score;
            }
        });
        episode.most_online = episode.most_online.max(online);
        best
    }

    /// Empties the magazines of the caches `each` visits on every CPU and
    /// gives their empty slabs back: the one drain-and-shrink of every
    /// reclaim, removal, cache destruction, `shrink` and `reap`. Returns
    /// the pages uncharged.
    pub(crate) fn drain_and_shrink<E: Env<R>>(env: &E, each: impl Fn(&mut dyn FnMut(&MagCache<R>))) -> usize {
        drain_many(env, &each, None);
        let mut pages = 0;
        each(&mut |c| pages += c.cache.shrink(&c.pages(env, None)));
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
        pages
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
        Self::planned(target, |v, take| match take {
            Take::Nothing => {}
            Take::Own => pages += v.counter.drain_stock(),
            Take::Subtree => v.walk_subtree(|g| pages += g.counter.drain_stock()),
        });
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

    /// Calls `f` on every cache charging `g` itself.
    fn own_caches(&self, g: &Group<R>, f: &mut dyn FnMut(&MagCache<R>)) {
        if self.is_root(g) {
            self.root_caches(f);
        } else {
            g.for_each_cache(|_, c| f(c));
        }
    }

    /// Calls `f` on the caches charging the root: its size classes and
    /// its accounted typed caches.
    pub(crate) fn root_caches(&self, f: &mut dyn FnMut(&MagCache<R>)) {
        self.base_caches(|c| {
            if c.acct == Acct::Root {
                f(c)
            }
        });
    }

    /// Calls `f` on the base caches: the size classes, then the typed
    /// caches.
    fn base_caches(&self, mut f: impl FnMut(&MagCache<R>)) {
        self.classes.iter().for_each(&mut f);
        self.for_each_desc(|d| f(&d.cache));
    }

    /// Calls `f` on every cache: base caches and every group's child caches.
    pub(crate) fn for_each_cache(&self, f: &mut dyn FnMut(&MagCache<R>)) {
        let _read = self.read_guard();
        self.base_caches(&mut *f);
        self.for_each_group(|g| g.for_each_cache(|_, c| f(c)));
    }

    /// Empties every magazine and every charge stock, gives every empty
    /// slab back, and reclaims what groups and caches wait for it. Returns
    /// the pages given back.
    pub(crate) fn shrink<E: Env<R>>(&self, env: &E) -> usize {
        let read = self.read_guard();
        let pages = Self::drain_and_shrink(env, |f| self.for_each_cache(f));
        self.for_each_group_and_root(|g| {
            g.counter.drain_stock();
        });
        drop(read);
        self.finish_reclaim(env);
        let plain = Pages::plain(env.src());
        for meta in [&self.child_caches, &self.groups, &self.descriptors, &self.pressure_nodes] {
            meta.shrink(&plain);
        }
        pages
    }

    /// Bonwick's reap (see `Kmem::reap`): the magazines of the slots in
    /// `idle` and the depot magazines unused since the last reap go back
    /// to the slabs, and empty slabs to the page source.
    pub(crate) fn reap<E: Env<R>>(&self, env: &E, idle: &[bool; crate::platform::MAX_CPUS]) -> usize {
        let mut pages = 0;
        self.for_each_cache(&mut |c| {
            c.reap(env, idle);
            pages += c.cache.shrink(&c.pages(env, None));
        });
        self.finish_reclaim(env);
        pages
    }

    /// After caches gave back slabs: dead caches now empty let go of their
    /// groups, and groups whose last reference went are reclaimed.
    pub(crate) fn finish_reclaim<E: Env<R>>(&self, env: &E) {
        self.release_empty_dead();
        self.reclaim_groups(env, &mut self.lock.lock());
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
    env.plat().in_interrupt() || env.plat().current_group().addr() & RECLAIMING != 0
}
