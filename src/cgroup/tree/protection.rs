//! Protection: a group's effective `min` and `low` for one reclaim, and
//! the plan of what a reclaim pass may take from a subtree.
//!
//! A reclaim has a *root*: the group whose limit it serves (its own
//! `max` or `high`, or [`Cgroup::reclaim`](crate::Cgroup::reclaim)), or
//! the tree's root for contention. The root itself is unprotected (a
//! group's protection shields it from reclaim on behalf of others, never
//! from its own limits); each group below it has an *effective*
//! protection, as in Linux (mm/page_counter.c, cgroup v2 without
//! `memory_recursiveprot`):
//!
//! * a child of the root keeps what it claims: its usage up to its
//!   `min` (and, separately, up to its `low`);
//! * deeper, a child's effective protection is bounded by its parent's:
//!   while what the parent's children claim together fits the parent's
//!   effective protection, each keeps its claim; when they overcommit
//!   it, it is shared out in proportion to each child's claim
//!   ([`effective_protection`]). A child that claims nothing gets
//!   nothing, whatever its parent's protection covers.
//!
//! A group whose usage is within its effective `min` is never reclaimed.
//! One within its effective `low` is passed over by a first pass; only
//! when that pass found nothing unprotected left does a second pass take
//! from it (counting a `low` event), still honouring `min`. What a group
//! gives is judged on its own: a protected group's children that claim
//! nothing are reclaimed, and an unprotected group's protected children
//! are not.
//!
//! Linux keeps the children's claims summed on every charge
//! (`propagate_protected_usage`); here they are summed when a reclaim
//! asks, so charges pay nothing. The values are computed fresh for each
//! group a walk reaches and never stored, so concurrent reclaims with
//! different roots never see each other's, and a walk whose shrinkers
//! free objects as it goes judges each group by the usage left when it
//! gets there (a memo of the parents' values made a reclaim take one
//! object below a parent's `min`).

use core::ptr;

use lock_api::RawMutex;

use super::Tree;
use crate::cgroup::Group;
use crate::counter::effective_protection;

/// A group's effective protection for one reclaim, in pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Protection {
    /// Never reclaimed while usage is within it.
    pub(crate) min: usize,
    /// Reclaimed only by a pass that found nothing unprotected left.
    pub(crate) low: usize,
}

impl Protection {
    const NONE: Protection = Protection { min: 0, low: 0 };
}

/// What one reclaim pass honours, and what it found.
pub(super) struct Pass {
    /// Whether `low` holds (the first pass); the second honours `min` only.
    pub(super) honour_low: bool,
    /// Set when a group was passed over for its `low`: then a second pass
    /// may take from it.
    pub(super) low_skipped: bool,
}

impl Pass {
    /// The first pass of a reclaim: honours `min` and `low`.
    pub(super) fn first() -> Pass {
        Pass { honour_low: true, low_skipped: false }
    }

    /// The second pass: takes from groups within their `low`, never from
    /// one within its `min`.
    pub(super) fn breaching_low() -> Pass {
        Pass { honour_low: false, low_skipped: false }
    }
}

/// What a walk of a pass does at one group.
#[derive(Clone, Copy, Debug)]
pub(super) struct Visit {
    /// What it takes.
    pub(super) take: Take,
    /// Pages of the group's usage it leaves alone: the protection it
    /// honours there.
    pub(super) floor: usize,
    /// Whether the group's usage is within its effective `low` (taking
    /// from it then breaches its `low`).
    pub(super) within_low: bool,
}

/// What a walk takes from a group it reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Take {
    /// Nothing: it is protected (its children are judged on their own).
    Nothing = 0,
    /// What is charged to the group itself (and to its removed children,
    /// whose objects it inherits): some of its children may be protected.
    Own = 1,
    /// The whole subtree: no group in it is protected.
    Subtree = 2,
}

impl Take {
    /// As stored in `Group::plan`.
    pub(super) fn from_u8(v: u8) -> Take {
        match v {
            1 => Take::Own,
            2 => Take::Subtree,
            _ => Take::Nothing,
        }
    }
}

/// Levels [`Tree::protection`] holds on its stack at a time (512 bytes).
const PATH: usize = 64;

impl<R: RawMutex> Tree<R> {
    /// `g`'s effective protection in a reclaim whose root is `root` (an
    /// ancestor of `g`, or `g`, which is then unprotected); nothing for a
    /// group not below `root`. The caller holds the tree lock or a read
    /// guard (the children of `g`'s ancestors are summed).
    ///
    /// Without recursion or allocation, in `O(depth * depth / PATH)` steps:
    /// the levels from `root`'s child down to `g` are taken [`PATH`] at a
    /// time into a buffer on the stack, each batch found by one walk up
    /// from `g`, and only when every one of them claims protection (else
    /// the answer is none, found in one walk up). (It was `depth^2` per
    /// group, `depth^3` for a walk of a chain: a 1,500-deep chain with
    /// `min` and `low` at every level took 3-6 s for one reclaim.)
    pub(crate) fn protection(root: &Group<R>, g: &Group<R>) -> Protection {
        if ptr::eq(root, g) {
            return Protection::NONE;
        }
        // Every level between `root` and `g` must claim some protection for
        // `g` to have any (a level that claims none passes none down).
        let (mut min_on, mut low_on) = (true, true);
        let mut depth = 0usize;
        let mut cur = g;
        loop {
            min_on &= cur.counter.min() > 0;
            low_on &= cur.counter.low() > 0;
            depth += 1;
            if !min_on && !low_on {
                return Protection::NONE;
            }
            match cur.parent() {
                Some(p) if ptr::eq(p, root) => break,
                Some(p) => cur = p,
                None => return Protection::NONE,
            }
        }
        let claim = |x: &Group<R>| {
            let (min, low) = x.counter.protected();
            Protection { min: if min_on { min } else { 0 }, low: if low_on { low } else { 0 } }
        };
        let mut e = Protection::NONE;
        let mut path: [*const Group<R>; PATH] = [ptr::null(); PATH];
        // Levels below `root`: 0 is `root`'s child, `depth - 1` is `g`.
        let mut level = 0;
        while level < depth {
            let end = (level + PATH).min(depth);
            // The ancestor at level `end - 1`, then the batch up from it.
            let mut a = g;
            for _ in end..depth {
                a = a.parent().unwrap_or(a);
            }
            for slot in path[..end - level].iter_mut().rev() {
                *slot = a;
                a = a.parent().unwrap_or(a);
            }
            for (i, &x) in path[..end - level].iter().enumerate() {
                // SAFETY: `g` or one of its ancestors, which the caller's
                // lock or guard (and the references children hold on their
                // parents) keep alive.
                let x = unsafe { &*x };
                let own = claim(x);
                e = if level + i == 0 {
                    own
                } else {
                    let mut siblings = Protection::NONE;
                    if let Some(p) = x.parent() {
                        for c in p.children() {
                            let s = claim(c);
                            siblings.min = siblings.min.saturating_add(s.min);
                            siblings.low = siblings.low.saturating_add(s.low);
                        }
                    }
                    Protection {
                        min: effective_protection(own.min, e.min, siblings.min),
                        low: effective_protection(own.low, e.low, siblings.low),
                    }
                };
                if e == Protection::NONE {
                    return e;
                }
            }
            level = end;
        }
        e
    }

    /// Walks `target`'s subtree for a pass of a reclaim rooted at `root`
    /// and calls `f` with each group reached and what the pass does there
    /// ([`Visit`]). Below a group it takes whole, it goes no further. The
    /// caller holds the tree lock, or a read guard and a reference on
    /// `target`.
    pub(super) fn plan(root: &Group<R>, target: &Group<R>, pass: &mut Pass, mut f: impl FnMut(&Group<R>, Visit)) {
        target.walk_pruned(|v| {
            let e = Self::protection(root, v);
            let u = v.counter.usage();
            let within_min = e.min != 0 && u <= e.min;
            let within_low = e.low != 0 && u <= e.low;
            // Whether a child may be protected: a child's protection is
            // bounded by this group's, and only a claim makes any.
            let deeper = (ptr::eq(v, root) || e != Protection::NONE)
                && v.children().any(|c| c.counter.min() > 0 || c.counter.low() > 0);
            let take = if within_min {
                Take::Nothing
            } else if within_low && pass.honour_low {
                pass.low_skipped = true;
                Take::Nothing
            } else if deeper {
                Take::Own
            } else {
                Take::Subtree
            };
            let floor = if pass.honour_low { e.min.max(e.low) } else { e.min };
            f(v, Visit { take, floor, within_low });
            take != Take::Subtree
        });
    }

    /// The walk a reclaim's shrinker round makes, without the shrinkers:
    /// under a read guard and no lock, a pass over `target`'s subtree
    /// calling `f` on each group it takes from (for the loom models).
    #[cfg(loom)]
    pub(crate) fn reclaim_walk(&self, target: &Group<R>, mut f: impl FnMut(&Group<R>)) {
        let _read = self.read_guard();
        Self::plan(target, target, &mut Pass::first(), |v, visit| {
            if visit.take != Take::Nothing {
                f(v)
            }
        });
    }
}
