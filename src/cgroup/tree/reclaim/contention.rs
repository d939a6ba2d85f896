//! Contention reclaim: when the page source is exhausted or the root
//! crosses the contention mark, groups are reclaimed one step at a time,
//! largest excess over the soft limit first, in episodes that visit each
//! group once.

use lock_api::RawMutex;

use super::super::Tree;
use super::super::protection::Pass;
use super::{Held, reclaiming};
use crate::cgroup::Group;
use crate::magazine::Env;
use crate::sync::Ordering;

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

impl<R: RawMutex> Tree<R> {
    /// Sets the contention mark, in pages (see `Kmem::set_contention_mark`).
    pub(crate) fn set_contention_mark(&self, pages: usize) {
        self.contention_mark.store(pages, Ordering::Relaxed);
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
}
