//! Reclaim: shrinkers, subtree reclaim in passes, `high` throttling, and
//! soft-limit reclaim under contention (with `low` protection).
//!
//! Reclaim of a group subtree has a goal (the pages a refused charge needs,
//! plus a batch of 1/32 of the group's usage so the next charges do not
//! all reclaim, as Linux reclaims at least `SWAP_CLUSTER_MAX` pages) and
//! runs in passes: drain the subtree's magazines, free its empty slabs and
//! stocks (under the tree lock), then call the shrinkers for the group on
//! every node (with no allocator lock held), asking for a growing share of
//! what they hold: 1/64, 1/16, 1/4, then all (Linux scans at rising
//! priority). It stops as soon as the goal is met; a pass whose shrinkers
//! freed nothing ends it, and there are at most [`RECLAIM_PASSES`]: with
//! nothing reclaimable, reclaim terminates after one pass (seed 002's
//! swapoff case).
//!
//! Under contention (the page source is exhausted, or root usage crosses
//! the contention mark), the group with the largest excess over its soft
//! limit is reclaimed first, then the next, until the contention is over
//! or no group over its soft limit frees anything; then every group not
//! protected by `low` is reclaimed. The candidates are found by a scan of
//! the groups when contention strikes, not kept sorted on the fast path
//! (seed 002's RB-tree): contention is rare and the scan takes no lock.

use lock_api::RawMutex;

use super::Kmem;
use crate::cgroup::{Group, RECLAIMING, untag};
use crate::error::Error;
use crate::magazine::{Acct, MagCache, drain_many};
use crate::platform::{PageSource, Platform};
use crate::slab::Pages;
use crate::sync::Ordering;

/// Shrinkers one `Kmem` can hold at once; one more gives
/// [`Error::TooManyShrinkers`]. Unregistering frees the slot.
pub const MAX_SHRINKERS: usize = 64;
/// The most passes one subtree reclaim runs.
pub(crate) const RECLAIM_PASSES: usize = 4;
/// The share of what they hold that shrinkers are asked for, pass by pass.
const SHARES: [usize; RECLAIM_PASSES] = [64, 16, 4, 1];
/// One contention-reclaim episode: the groups it reclaimed carry its id
/// in `Group::visited`, so each is reclaimed once per episode however many
/// groups there are. Episodes of other threads may overwrite a mark; the
/// step bound ([`Episode::may_step`]) keeps an episode finite even then.
pub(crate) struct Episode {
    /// Where this episode started in the allocator's sequence (never 0;
    /// wraps after 2^32 episodes, when a stale mark costs one extra visit).
    id: u32,
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
    fn done(&self, mark: u32) -> bool {
        mark != 0 && mark.wrapping_sub(self.id) < (1 << 31)
    }

    /// Whether another group may be reclaimed: at most twice the most
    /// groups a scan of this episode found, plus one (each group once, and
    /// once more for each mark another episode overwrote), so an episode
    /// ends however the tree changes under it.
    fn may_step(&self) -> bool {
        self.steps <= self.most_online.saturating_mul(2).saturating_add(1)
    }
}

/// A group's identity for shrinkers: stable while the group has charged
/// objects. It holds the group's address (null for the root) and is only
/// compared, or followed up the tree by [`ShrinkControl::contains`] while
/// the group is live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupId(pub(crate) *const ());

// SAFETY: a `GroupId` is an identity: nothing dereferences it except
// `ShrinkControl::contains`, whose contract requires the group to be live,
// and groups are shared between threads (`Sync`) anyway.
unsafe impl Send for GroupId {}
// SAFETY: as above; it has no interior mutability.
unsafe impl Sync for GroupId {}

impl GroupId {
    /// The root group.
    pub const ROOT: GroupId = GroupId(core::ptr::null());
}

/// What a shrinker is asked to shrink: objects charged to `target` or to
/// any of its descendants, on `node`.
pub struct ShrinkControl {
    target: GroupId,
    node: usize,
    /// `contains` for the allocator's group type.
    within: fn(GroupId, GroupId) -> bool,
}

/// Whether group `g` is `target` or below it, for groups of lock type `R`.
fn within<R: RawMutex>(target: GroupId, g: GroupId) -> bool {
    if target == GroupId::ROOT {
        return true;
    }
    let mut cur = g.0.cast::<Group<R>>();
    while !cur.is_null() {
        if core::ptr::eq(cur.cast(), target.0) {
            return true;
        }
        // SAFETY: `ShrinkControl::contains` requires `g` to be live, and a
        // live group's ancestors are live.
        cur = unsafe { (*cur).parent };
    }
    false
}

impl ShrinkControl {
    /// The group whose subtree is being reclaimed.
    pub fn target(&self) -> GroupId {
        self.target
    }

    /// The node being reclaimed.
    pub fn node(&self) -> usize {
        self.node
    }

    /// Whether objects charged to `g` are in scope: `g` is the target or
    /// one of its descendants. `g` must be a group that still has charged
    /// objects (or a live handle), as any group a shrinker's objects were
    /// charged to is.
    pub fn contains(&self, g: GroupId) -> bool {
        (self.within)(self.target, g)
    }
}

/// A cache of objects that can be freed on demand (Linux's group- and
/// node-aware shrinkers): a dentry LRU, a connection pool.
///
/// Shrinkers are called with no allocator lock held, from whatever thread
/// is reclaiming; they may free objects (which is the point), but should
/// not allocate.
pub trait Shrinker: Sync {
    /// How many objects in scope could be freed.
    fn count(&self, sc: &ShrinkControl) -> usize;
    /// Frees up to `nr` objects in scope; returns how many it freed.
    fn scan(&self, sc: &ShrinkControl, nr: usize) -> usize;
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Registers a shrinker; safe while reclaim runs (a reclaim in progress
    /// uses the list it copied). Registering one twice is a no-op.
    pub fn register_shrinker(&self, s: &'static dyn Shrinker) -> Result<(), Error> {
        let mut list = self.shrinkers.lock();
        if list.iter().flatten().any(|x| core::ptr::addr_eq(*x, s)) {
            return Ok(());
        }
        let slot = list.iter_mut().find(|x| x.is_none()).ok_or(Error::TooManyShrinkers)?;
        *slot = Some(s);
        Ok(())
    }

    /// Unregisters a shrinker; a reclaim already running may still call it
    /// once (it is `'static`, so that is safe).
    pub fn unregister_shrinker(&self, s: &'static dyn Shrinker) {
        for x in self.shrinkers.lock().iter_mut() {
            if x.is_some_and(|y| core::ptr::addr_eq(y, s)) {
                *x = None;
            }
        }
    }

    /// Sets the contention mark: when the root's usage is above `bytes`,
    /// allocation slow paths reclaim from groups over their soft limits
    /// (largest excess first). `usize::MAX` (the default): only when the
    /// page source is exhausted.
    pub fn set_contention_mark(&self, bytes: usize) {
        let pages = if bytes == usize::MAX { usize::MAX } else { bytes / crate::platform::PAGE_SIZE };
        self.contention_mark.store(pages, Ordering::Relaxed);
    }

    /// The identity shrinkers see for `g`.
    pub(crate) fn group_id(&self, g: &Group<R>) -> GroupId {
        if core::ptr::eq(g, &self.root) { GroupId::ROOT } else { GroupId((g as *const Group<R>).cast()) }
    }

    /// Reclaims `g`'s subtree in passes until about `want` pages came
    /// back (see the module docs); returns the pages uncharged.
    pub(crate) fn reclaim(&self, g: &Group<R>, want: usize) -> usize {
        if self.reclaiming() {
            return 0;
        }
        // Progress is what the counter shows: pages drained from caches
        // that other charges refill at once are no progress.
        let start = g.counter.usage();
        let freed = || start.saturating_sub(g.counter.usage());
        self.reclaim_caches(g);
        for share in SHARES {
            // A pass may free nothing and still progress (a shrinker
            // rotating referenced objects): only an empty scope ends it.
            if freed() >= want || self.run_shrinkers(g, share).1 == 0 {
                break;
            }
            self.reclaim_caches(g);
        }
        freed()
    }

    /// The goal of a reclaim after `g` refused a charge of `pages`: the
    /// charge plus a batch of 1/32 of its usage.
    pub(crate) fn reclaim_goal(g: &Group<R>, pages: usize) -> usize {
        pages.saturating_add(g.counter.usage() / 32)
    }

    /// Up to `passes` passes, each asking shrinkers for `1/share` of what
    /// they hold in scope; stops early when a pass frees nothing.
    fn reclaim_passes(&self, g: &Group<R>, passes: usize, share: usize) -> usize {
        let mut pages = 0;
        for _ in 0..passes {
            pages += self.reclaim_caches(g);
            let before = g.counter.usage();
            if self.run_shrinkers(g, share).0 == 0 {
                break;
            }
            pages += before.saturating_sub(g.counter.usage());
        }
        pages
    }

    /// Calls every shrinker for `g` on every node, without locks held;
    /// returns the objects they freed and the objects they held in scope.
    /// What a shrinker reports is clamped (a `scan` frees at most what it
    /// was asked for; sums saturate), so a shrinker that lies cannot make
    /// reclaim overflow or loop. While they run, the context's current
    /// group token carries the [`RECLAIMING`] tag: an allocation a shrinker
    /// makes charges as usual but skips reclaim ([`Kmem::reclaiming`]).
    fn run_shrinkers(&self, g: &Group<R>, share: usize) -> (usize, usize) {
        let list = *self.shrinkers.lock();
        let (mut freed, mut held) = (0usize, 0usize);
        if list.iter().all(Option::is_none) {
            return (0, 0);
        }
        // The tagged token names the same group with the same reference,
        // so the platform slot's reference is untouched.
        let token = self.platform.current_group();
        self.platform.set_current_group(token.map_addr(|a| a | RECLAIMING));
        for s in list.iter().flatten() {
            for node in 0..self.platform.nodes().max(1) {
                let sc = ShrinkControl { target: self.group_id(g), node, within: within::<R> };
                // A share per pass (at least one), as Linux scans at a
                // priority rather than emptying a cache at once.
                let n = s.count(&sc);
                held = held.saturating_add(n);
                if n > 0 {
                    let nr = (n / share).saturating_add(1);
                    freed = freed.saturating_add(s.scan(&sc, nr).min(nr));
                }
            }
        }
        // Clear the tag of whatever is current now: the token set above,
        // or (if a shrinker dropped guards out of order) the group it left
        // current, which keeps its reference either way.
        let now = self.platform.current_group();
        if now.addr() & RECLAIMING != 0 {
            self.platform.set_current_group(untag(now));
        }
        (freed, held)
    }

    /// Whether the calling context is running shrinkers (an allocation
    /// from inside one): reclaim is then skipped, never re-entered.
    #[inline]
    pub(crate) fn reclaiming(&self) -> bool {
        self.platform.current_group().addr() & RECLAIMING != 0
    }

    /// After a magazine refill from `cache`: an allocating task whose group
    /// (or an ancestor) is above `high` reclaims from it before returning
    /// (it never fails for `high`); above the contention mark, soft-limit
    /// reclaim runs.
    pub(crate) fn after_refill(&self, cache: &MagCache<R>) {
        let counter = match cache.acct {
            Acct::None => return,
            Acct::Root => &self.root.counter,
            // SAFETY: a child cache's group outlives it.
            Acct::Counter(c) => unsafe { &*c },
        };
        // SAFETY: every counter is a group's.
        let g = unsafe { Group::<R>::of_counter(counter) };
        let mut level = Some(g);
        while let Some(l) = level {
            if l.counter.usage() > l.counter.high() {
                l.ev_high.add(1);
                let excess = l.counter.usage().saturating_sub(l.counter.high());
                self.reclaim(l, Self::reclaim_goal(l, excess));
            }
            level = l.parent();
        }
        let mark = self.contention_mark.load(Ordering::Relaxed);
        if self.root.counter.usage() > mark {
            self.contention_reclaim(mark);
        }
    }

    /// Reclaims under contention until root usage is at most `mark`
    /// pages, or nothing more can be freed.
    #[cold]
    pub(crate) fn contention_reclaim(&self, mark: usize) {
        let mut episode = self.episode();
        while self.root.counter.usage() > mark && self.contention_step(&mut episode) {}
    }

    /// A new contention-reclaim episode.
    pub(crate) fn episode(&self) -> Episode {
        // `Relaxed`: only uniqueness matters (an RMW gives it). Skips 0,
        // the mark of a group no episode reclaimed, after a wrap.
        let mut id = 0;
        while id == 0 {
            id = self.episodes.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        }
        Episode { id, steps: 0, most_online: 0, root: false }
    }

    /// One step of contention reclaim: reclaims the group with the largest
    /// excess over its soft limit, or if none is over, the largest group
    /// not protected by `low`, or finally the root's own caches; groups
    /// this episode reclaimed are skipped and the one reclaimed is marked.
    /// `false` when nothing was left to try, or from inside a shrinker.
    pub(crate) fn contention_step(&self, episode: &mut Episode) -> bool {
        if self.reclaiming() {
            return false;
        }
        for soft in [true, false] {
            // The candidate is referenced, so it outlives the iteration.
            let mut best: *const Group<R> = core::ptr::null();
            let mut best_score = 0;
            let mut online = 0usize;
            self.for_each_group(|g| {
                if g.is_offline() {
                    return;
                }
                online += 1;
                if episode.done(g.visited.load(Ordering::Relaxed)) {
                    return;
                }
                let (u, s, low) = (g.counter.usage(), g.counter.soft(), g.counter.low());
                let score = if soft {
                    u.saturating_sub(s)
                } else if u <= low {
                    g.ev_low.add(1);
                    0
                } else {
                    u
                };
                // A group whose last reference is gone is not revived.
                if score > best_score && g.try_get() {
                    // SAFETY: the previous candidate holds our reference.
                    if let Some(prev) = unsafe { best.as_ref() } {
                        self.put_group(prev);
                    }
                    best = g;
                    best_score = score;
                }
            });
            episode.most_online = episode.most_online.max(online);
            // SAFETY: referenced above.
            if let Some(b) = unsafe { best.as_ref() } {
                if !episode.may_step() {
                    self.put_group(b);
                    break;
                }
                // Contention reclaim takes a little at a time (1/16 of what
                // the shrinkers hold, one pass) and lets the caller retry,
                // so groups settle near their soft limits instead of
                // swinging.
                let pages = self.reclaim_passes(b, 1, 16);
                if soft {
                    b.ev_soft.add(1);
                    b.soft_pages.add(pages);
                }
                // Mark it, unless a later episode already did (its mark
                // covers this one too). A race here costs a visit at most.
                let mark = b.visited.load(Ordering::Relaxed);
                if mark == 0 || mark.wrapping_sub(episode.id) >= (1 << 31) {
                    b.visited.store(episode.id, Ordering::Relaxed);
                }
                episode.steps += 1;
                self.put_group(b);
                return true;
            }
        }
        if episode.root {
            return false;
        }
        episode.root = true;
        self.reclaim_caches_root_only();
        true
    }

    /// Drains and shrinks the root's own (base) caches.
    fn reclaim_caches_root_only(&self) {
        let _tree = self.tree_lock.lock();
        crate::magazine::drain_many(
            self,
            |f| {
                self.for_each_base_cache(|c| {
                    if c.acct == Acct::Root {
                        f(c)
                    }
                })
            },
            None,
        );
        self.for_each_base_cache(|c| {
            c.cache.shrink(&c.pages(self, None));
        });
        self.root.counter.drain_stock();
    }
}

/// Shrinking and reaping: what every cache holds unused goes back.
impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Gives back what `g`'s subtree holds unused in its caches: magazines,
    /// empty slabs, stocks. Returns the pages uncharged. (One step of
    /// [`Kmem::reclaim`], which adds the shrinkers.)
    pub(crate) fn reclaim_caches(&self, g: &Group<R>) -> usize {
        let _tree = self.tree_lock.lock();
        let _read = self.read_guard();
        drain_many(self, |f| self.subtree_caches(g, f), None);
        let mut pages = 0;
        self.subtree_caches(g, &mut |c| pages += c.cache.shrink(&c.pages(self, None)));
        g.walk_subtree(|grp| pages += grp.counter.drain_stock());
        pages
    }

    /// Calls `f` on every cache charging a group of `g`'s subtree (for the
    /// root, its own are the base caches it is charged for).
    pub(super) fn subtree_caches(&self, g: &Group<R>, f: &mut dyn FnMut(&MagCache<R>)) {
        g.walk_subtree(|grp| {
            if core::ptr::eq(grp, &self.root) {
                self.for_each_base_cache(|c| {
                    if c.acct == Acct::Root {
                        f(c)
                    }
                });
            } else {
                grp.for_each_cache(|_, c| f(c));
            }
        });
    }

    /// Calls `f` on the base caches: the size classes, then the live typed
    /// caches.
    pub(super) fn for_each_base_cache(&self, mut f: impl FnMut(&MagCache<R>)) {
        self.classes.iter().for_each(&mut f);
        self.for_each_desc(|d| f(&d.cache));
    }

    /// Calls `f` on every cache: base caches and every group's child caches.
    pub(super) fn for_each_cache(&self, f: &mut dyn FnMut(&MagCache<R>)) {
        let _read = self.read_guard();
        self.for_each_base_cache(&mut *f);
        self.for_each_group(|g| g.for_each_cache(|_, c| f(c)));
    }

    /// Empties every magazine on every CPU and in every depot, gives every
    /// empty slab back to the page source, drains every charge stock, and
    /// trims the source. Returns the pages given back. (Linux
    /// `kmem_cache_shrink` on all caches.)
    pub fn shrink(&self) -> usize {
        let _read = self.read_guard();
        drain_many(self, |f| self.for_each_cache(f), None);
        let mut pages = 0;
        self.for_each_cache(&mut |c| pages += c.cache.shrink(&c.pages(self, None)));
        self.root.counter.drain_stock();
        self.for_each_group(|g| {
            g.counter.drain_stock();
        });
        drop(_read);
        self.release_empty_dead();
        self.reclaim_groups(&mut self.tree_lock.lock());
        self.magazines.shrink(&Pages::plain(&self.source));
        self.child_caches.shrink(&Pages::plain(&self.source));
        self.groups.shrink(&Pages::plain(&self.source));
        pages + self.source.trim()
    }

    /// Bonwick's working-set reap, for a periodic timer (he used 15 s):
    /// depot magazines unused since the last reap, the magazines of slots no
    /// thread holds, and those of slots unused since the last reap go back
    /// to the slabs; then empty slabs go back to the page source and the
    /// source is trimmed. Returns the pages given back. What a burst freed
    /// just before a reap is the working set of that interval: the next
    /// reap returns it if it stays unused.
    pub fn reap(&self) -> usize {
        let idle = self.slots.reap_idle_mask();
        let mut pages = 0;
        self.for_each_cache(&mut |c| {
            c.reap(self, &idle);
            pages += c.cache.shrink(&c.pages(self, None));
        });
        self.release_empty_dead();
        self.reclaim_groups(&mut self.tree_lock.lock());
        pages + self.source.trim()
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
