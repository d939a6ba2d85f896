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
//! asks, so charges pay nothing. A walk computes them as it goes
//! ([`Memo`]): a group's from its parent's, which the walk reached just
//! before, and each parent's children's claims once, so a walk costs in
//! proportion to the groups it reaches (a 1,500-deep chain with `min` and
//! `low` at every level used to cost `depth^3`). The values live in the
//! walk's own memo, never in the groups, so concurrent reclaims with
//! different roots never see each other's.

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

/// Groups a [`Memo`] remembers (a few hundred bytes of stack each way).
const MEMO: usize = 16;

/// One remembered group: its effective protection, and (once asked) what
/// its children claim together.
#[derive(Clone, Copy)]
struct Slot {
    g: *const (),
    e: Protection,
    kids: Option<Protection>,
}

/// The effective protections one walk has computed, by group (a small
/// direct-mapped table on the walker's stack): a walk that reaches a
/// group after its parent, as a pre-order walk does, computes each
/// group's from its parent's in one step.
pub(crate) struct Memo<'a, R: RawMutex> {
    root: &'a Group<R>,
    slots: [Slot; MEMO],
}

impl<'a, R: RawMutex> Memo<'a, R> {
    /// For a reclaim whose root is `root`.
    pub(crate) fn new(root: &'a Group<R>) -> Self {
        Memo { root, slots: [Slot { g: ptr::null(), e: Protection::NONE, kids: None }; MEMO] }
    }

    fn index(g: &Group<R>) -> usize {
        let a = ptr::from_ref(g).addr();
        ((a >> 6) ^ (a >> 12)) % MEMO
    }

    fn find(&self, g: &Group<R>) -> Option<Protection> {
        let s = &self.slots[Self::index(g)];
        ptr::eq(s.g, ptr::from_ref(g).cast()).then_some(s.e)
    }

    fn put(&mut self, g: &Group<R>, e: Protection) {
        self.slots[Self::index(g)] = Slot { g: ptr::from_ref(g).cast(), e, kids: None };
    }

    /// What `p`'s children claim together (remembered with `p`'s slot
    /// while it holds `p`).
    fn kids(&mut self, p: &Group<R>) -> Protection {
        let i = Self::index(p);
        if ptr::eq(self.slots[i].g, ptr::from_ref(p).cast())
            && let Some(k) = self.slots[i].kids
        {
            return k;
        }
        let mut sum = Protection::NONE;
        for c in p.children() {
            let (min, low) = c.counter.protected();
            sum.min = sum.min.saturating_add(min);
            sum.low = sum.low.saturating_add(low);
        }
        if ptr::eq(self.slots[i].g, ptr::from_ref(p).cast()) {
            self.slots[i].kids = Some(sum);
        }
        sum
    }

    /// `g`'s effective protection (as [`Tree::protection`]): from its
    /// parent's if the memo holds it, else from the nearest remembered
    /// ancestor down, remembering each level on the way. An unremembered
    /// stretch longer than the memo starts from [`Tree::protection`] of
    /// its top.
    pub(crate) fn protection(&mut self, g: &Group<R>) -> Protection {
        if ptr::eq(self.root, g) {
            return Protection::NONE;
        }
        if let Some(e) = self.find(g) {
            return e;
        }
        let mut path: [*const Group<R>; MEMO] = [ptr::null(); MEMO];
        let mut n = 0;
        let mut cur = g;
        // The effective protection of the parent of `path[n - 1]`; `None`
        // when that parent is the root.
        let top = loop {
            path[n] = cur;
            n += 1;
            let Some(p) = cur.parent() else { return Protection::NONE };
            if ptr::eq(p, self.root) {
                break None;
            }
            if let Some(e) = self.find(p) {
                break Some(e);
            }
            if n == MEMO {
                let e = Tree::protection(self.root, p);
                self.put(p, e);
                break Some(e);
            }
            cur = p;
        };
        let mut e = top;
        for &x in path[..n].iter().rev() {
            // SAFETY: `g` and its ancestors, live while the walk runs (the
            // caller's guard or lock, and the references children hold).
            let x = unsafe { &*x };
            let (min, low) = x.counter.protected();
            let own = Protection { min, low };
            let ex = match (e, x.parent()) {
                (Some(pe), Some(p)) => {
                    let sib = self.kids(p);
                    Protection {
                        min: effective_protection(own.min, pe.min, sib.min),
                        low: effective_protection(own.low, pe.low, sib.low),
                    }
                }
                _ => own,
            };
            self.put(x, ex);
            e = Some(ex);
        }
        e.unwrap_or(Protection::NONE)
    }
}

impl<R: RawMutex> Tree<R> {
    /// `g`'s effective protection in a reclaim whose root is `root` (an
    /// ancestor of `g`, or `g`, which is then unprotected); nothing for a
    /// group not below `root`. The caller holds the tree lock or a read
    /// guard (the children of `g`'s ancestors are summed).
    ///
    /// Without recursion or allocation: the levels from `root`'s child down
    /// to `g` are found by walking up from `g` once per level, which costs
    /// `depth^2` steps, and only when every one of them claims protection
    /// (else the answer is none, found in one walk up).
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
        for level in 0..depth {
            // The ancestor of `g` (or `g`) `level` levels below `root`.
            let mut a = g;
            for _ in level + 1..depth {
                a = a.parent().unwrap_or(a);
            }
            let own = claim(a);
            e = if level == 0 {
                own
            } else {
                let mut siblings = Protection::NONE;
                if let Some(p) = a.parent() {
                    for c in p.children() {
                        let x = claim(c);
                        siblings.min = siblings.min.saturating_add(x.min);
                        siblings.low = siblings.low.saturating_add(x.low);
                    }
                }
                Protection {
                    min: effective_protection(own.min, e.min, siblings.min),
                    low: effective_protection(own.low, e.low, siblings.low),
                }
            };
            if e == Protection::NONE {
                break;
            }
        }
        e
    }

    /// Walks `target`'s subtree for a pass of a reclaim rooted at `root`
    /// and calls `f` with each group reached and what the pass does there
    /// ([`Visit`]). Below a group it takes whole, it goes no further. The
    /// caller holds the tree lock, or a read guard and a reference on
    /// `target`.
    pub(super) fn plan(root: &Group<R>, target: &Group<R>, pass: &mut Pass, mut f: impl FnMut(&Group<R>, Visit)) {
        let mut memo = Memo::new(root);
        target.walk_pruned(|v| {
            let e = memo.protection(v);
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
