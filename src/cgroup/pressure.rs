//! Named pressure resources of a group (see `counter::pressure`).

use core::fmt;
use core::ptr::{self, NonNull};

use lock_api::RawMutex;

use core::mem::{align_of, size_of};

use super::{Group, Tree};
use crate::counter::{PressureCounter, Thresholds};
use crate::error::{Error, Name};
use crate::magazine::Env;
use crate::slab::{Geometry, Pages};
use crate::sync::{AtomicBool, AtomicPtr, AtomicUsize, Ordering, atomic_bool, atomic_null, atomic_usize};

/// The most pressure rows a group's stat shows (the first made); a group
/// may hold any number of resources.
pub(crate) const STAT_PRESSURES: usize = 8;

/// One named pressure resource of a group: a node of the group's list,
/// an object of the tree's `pressure_nodes` cache, freed with the group,
/// or, made for a descendant (not opened on its own group), once the last
/// resource below it goes (so a root does not keep a node for every name
/// a short-lived group ever opened). Written whole before it is linked
/// (`Release`); never written again but through its atomics, under the
/// tree lock but for its counter's.
pub(crate) struct PressureNode {
    next: AtomicPtr<PressureNode>,
    name: Name,
    counter: PressureCounter,
    /// The same resource's node one level up (null at the top), whose
    /// `children` counts this one; it lives while that count does.
    up: *const PressureNode,
    /// The `pressures` list of the group holding this node, which outlives
    /// it: where it is unlinked from.
    list: *const AtomicPtr<PressureNode>,
    /// Nodes whose `up` this is.
    children: AtomicUsize,
    /// Whether [`crate::Cgroup::pressure`] opened it on its own group
    /// (else it was made for a descendant, unlimited).
    opened: AtomicBool,
    /// The chain of unlinked nodes waiting in limbo (`next` stays as it
    /// was for a reader still on the node).
    retired_next: AtomicPtr<PressureNode>,
}

impl PressureNode {
    /// Slab geometry of the internal cache nodes live in.
    pub(crate) const GEOMETRY: Geometry = match Geometry::new(size_of::<Self>(), align_of::<Self>()) {
        Some(g) => g,
        None => panic!("PressureNode does not fit a slab"),
    };

    /// The link to the next node (for freeing the list).
    pub(super) fn next(&self) -> &AtomicPtr<PressureNode> {
        &self.next
    }

    /// The link of the limbo chain.
    pub(super) fn retired_next(&self) -> &AtomicPtr<PressureNode> {
        &self.retired_next
    }

    /// Called for each node of a group being freed (under the tree lock):
    /// the node one level up counts one resource fewer below it, and a
    /// node made for descendants whose last one this was leaves its
    /// group's list for `retire` (which frees it once no reader can be on
    /// it), taking its own count from the node above it in turn.
    ///
    /// # Safety
    ///
    /// `self` is a node of a group being freed, whose ancestors are live.
    pub(super) unsafe fn leave_above(&self, mut retire: impl FnMut(NonNull<PressureNode>)) {
        let mut up = self.up;
        // SAFETY: a node's `up` lives while it counts the node (below).
        while let Some(u) = unsafe { up.as_ref() } {
            if u.children.fetch_sub(1, Ordering::Relaxed) != 1
                || u.opened.load(Ordering::Relaxed)
                || u.counter.usage() != 0
            {
                return;
            }
            // SAFETY: `u`'s group outlives it, and its list changes only
            // under the tree lock, which we hold.
            let mut link = unsafe { &*u.list };
            loop {
                let cur = link.load(Ordering::Relaxed);
                if cur.is_null() {
                    debug_assert!(false, "a resource node missing from its group's list");
                    return;
                }
                if core::ptr::eq(cur, u) {
                    // Release: as `link_node`'s publication. A reader on
                    // `u` goes on through its `next`, unchanged.
                    link.store(u.next.load(Ordering::Relaxed), Ordering::Release);
                    break;
                }
                // SAFETY: a linked node, alive with its group.
                link = unsafe { &(*cur).next };
            }
            retire(NonNull::from(u));
            up = u.up;
        }
    }
}

impl<R: RawMutex> Group<R> {
    /// The group's resources, first made first.
    pub(super) fn pressure_nodes(&self) -> impl Iterator<Item = &PressureNode> {
        let mut cur = self.pressures.load(Ordering::Acquire);
        core::iter::from_fn(move || {
            // SAFETY: linked nodes live as long as their group.
            let n = unsafe { NonNull::new(cur)?.as_ref() };
            cur = n.next.load(Ordering::Acquire);
            Some(n)
        })
    }

    /// The resource `name`'s node, if any.
    fn pressure_node(&self, name: &Name) -> Option<&PressureNode> {
        self.pressure_nodes().find(|n| n.name == *name)
    }

    /// The resource `name`, if any.
    fn pressure(&self, name: &Name) -> Option<&PressureCounter> {
        self.pressure_node(name).map(|n| &n.counter)
    }

    /// The nearest resource named `name` from this group up.
    fn nearest_pressure(&self, name: &Name) -> Option<&PressureNode> {
        let mut cur = Some(self);
        while let Some(x) = cur {
            if let Some(n) = x.pressure_node(name) {
                return Some(n);
            }
            cur = x.parent();
        }
        None
    }

    /// Gives back what the group's resources hold to their ancestors' (the
    /// group is going, and with it every handle that could).
    pub(super) fn give_back_pressures(&self) {
        for node in self.pressure_nodes() {
            node.counter.give_back_own();
        }
    }

    /// Snapshots of the group's first [`STAT_PRESSURES`] resources, and
    /// how many it holds.
    pub(crate) fn pressure_rows(&self) -> ([PressureRow; STAT_PRESSURES], usize) {
        let mut out = [PressureRow::EMPTY; STAT_PRESSURES];
        let mut n = 0;
        for node in self.pressure_nodes() {
            if let Some(row) = out.get_mut(n) {
                let c = &node.counter;
                *row = PressureRow {
                    name: node.name,
                    usage: c.usage(),
                    t: c.thresholds(),
                    under: c.under_pressure(),
                    entered: c.entered.get(),
                    refused: c.refused.get(),
                };
            }
            n += 1;
        }
        (out, n)
    }
}

impl<R: RawMutex> Tree<R> {
    /// Group `g`'s pressure resource `name`, created with `thresholds` if
    /// it does not exist, else re-tuned to them (see `Cgroup::pressure`).
    /// It lives as long as the group.
    ///
    /// Every ancestor of a group holding a resource holds it too: one that
    /// lacks it gets it here, unlimited ([`Thresholds::UNLIMITED`]), before
    /// `g` does. So a resource's parent is always its parent group's, set
    /// once, and a charge reaches every ancestor, including one tuned
    /// after its descendants charged.
    pub(crate) fn open_pressure<E: Env<R>>(
        &self,
        env: &E,
        g: &Group<R>,
        name: Name,
        thresholds: Thresholds,
    ) -> Result<NonNull<PressureCounter>, Error> {
        if !thresholds.is_ordered() {
            return Err(Error::BadThresholds);
        }
        // New resources' nodes, made before the tree lock is taken (the
        // allocation may reclaim, which takes it) and kept in a list
        // through their first word; freed if not needed.
        let mut spare = SpareNodes(None);
        loop {
            let tree = self.lock.lock();
            let r = (|| {
                if g.is_offline() {
                    return Err(Error::Removed);
                }
                if let Some(parent_max) =
                    ancestors(g).filter_map(|a| a.pressure(&name)).map(|c| c.thresholds().max).min()
                    && thresholds.max > parent_max
                {
                    return Err(Error::AboveParentMax { parent_max });
                }
                if let Some(n) = g.pressure_node(&name) {
                    n.counter.set_thresholds(thresholds).map_err(|usage| Error::LimitBelowUsage { usage })?;
                    // Opened here now: it stays while the group does.
                    n.opened.store(true, Ordering::Relaxed);
                    return Ok(Some(NonNull::from(&n.counter)));
                }
                // `g` and its ancestors without the resource, nearest first.
                let lacking = || core::iter::once(g).chain(ancestors(g)).filter(|x| x.pressure(&name).is_none());
                if spare.len() < lacking().count() {
                    return Ok(None);
                }
                // Top down, so each resource's parent exists when it is made.
                while let Some(top) = lacking().last() {
                    let opened = core::ptr::eq(top, g);
                    let t = if opened { thresholds } else { Thresholds::UNLIMITED };
                    let Some(mem) = spare.pop() else { return Ok(None) };
                    // SAFETY: a spare node, unused; `top` is `g` or one of
                    // its ancestors, alive while `g` is.
                    unsafe { link_node(top, mem, name, t, opened) };
                }
                Ok(g.pressure(&name).map(NonNull::from))
            })();
            drop(tree);
            let r = match r {
                Ok(None) => match self.alloc_meta(env, &self.pressure_nodes) {
                    Some(mem) => {
                        // SAFETY: a fresh node of the node cache, ours.
                        unsafe { spare.push(mem) };
                        continue;
                    }
                    None => Err(Error::OutOfMemory),
                },
                Ok(Some(c)) => Ok(c),
                Err(e) => Err(e),
            };
            self.free_spare(env, &mut spare);
            return r;
        }
    }

    /// Frees the nodes `spare` still holds.
    fn free_spare<E: Env<R>>(&self, env: &E, spare: &mut SpareNodes) {
        while let Some(mem) = spare.pop() {
            // SAFETY: a node of the node cache, never linked: unused.
            unsafe { self.pressure_nodes.free(&Pages::plain(env.src()), mem) };
        }
    }
}

/// The ancestors of `g`, nearest first.
fn ancestors<R: RawMutex>(g: &Group<R>) -> impl Iterator<Item = &Group<R>> {
    let mut cur = g.parent();
    core::iter::from_fn(move || {
        let x = cur?;
        cur = x.parent();
        Some(x)
    })
}

/// Writes a resource node named `name` with `thresholds` into `mem` and
/// links it last in `g`'s list. Its parent is the nearest ancestor's
/// resource of that name (none at the top). Under the tree lock.
///
/// # Safety
///
/// `mem` is an unused object of the tree's node cache; `g` has no resource
/// `name`. `thresholds` are ordered and at most every ancestor's `max`.
/// Under the tree lock. `opened`: opened on `g` itself (see
/// [`PressureNode::opened`]).
unsafe fn link_node<R: RawMutex>(g: &Group<R>, mem: NonNull<u8>, name: Name, thresholds: Thresholds, opened: bool) {
    let n = mem.cast::<PressureNode>();
    let up = g.parent().and_then(|p| p.nearest_pressure(&name));
    let parent_ptr = up.map_or(ptr::null(), |u| &u.counter as *const PressureCounter);
    if let Some(u) = up {
        // Under the tree lock: `u` stays while it counts this node.
        u.children.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: the caller's node, sized and aligned for a node and
    // unpublished; the parent resource lives in an ancestor group, which
    // outlives this group, and stays while it counts this node.
    unsafe {
        n.as_ptr().write(PressureNode {
            next: atomic_null(),
            name,
            counter: PressureCounter::new(parent_ptr),
            up: up.map_or(ptr::null(), |u| u as *const PressureNode),
            list: &g.pressures,
            children: atomic_usize(0),
            opened: atomic_bool(opened),
            retired_next: atomic_null(),
        });
    }
    // SAFETY: just written, not yet shared.
    let set = unsafe { n.as_ref() }.counter.set_thresholds(thresholds);
    debug_assert!(set.is_ok(), "a new resource holds nothing, so ordered thresholds fit");
    // Linked last, so the list stays in the order made.
    let mut link = &g.pressures;
    while let Some(last) = NonNull::new(link.load(Ordering::Relaxed)) {
        // SAFETY: a linked node, alive with its group.
        link = unsafe { &last.as_ref().next };
    }
    // Release: the node is written before it can be seen.
    link.store(n.as_ptr(), Ordering::Release);
}

/// Unused resource nodes, a list through their first word.
struct SpareNodes(Option<NonNull<u8>>);

impl SpareNodes {
    /// # Safety
    ///
    /// `mem` is an unused node of the tree's node cache, now the list's.
    unsafe fn push(&mut self, mem: NonNull<u8>) {
        let next = self.0.map_or(ptr::null_mut(), NonNull::as_ptr);
        // SAFETY: the node is ours, and sized and aligned for a pointer.
        unsafe { mem.cast::<*mut u8>().as_ptr().write(next) };
        self.0 = Some(mem);
    }

    fn pop(&mut self) -> Option<NonNull<u8>> {
        let mem = self.0?;
        // SAFETY: pushed: its first word is the next node or null.
        self.0 = NonNull::new(unsafe { mem.cast::<*mut u8>().as_ptr().read() });
        Some(mem)
    }

    fn len(&self) -> usize {
        let mut n = 0;
        let mut cur = self.0;
        while let Some(mem) = cur {
            n += 1;
            // SAFETY: as in `pop`.
            cur = NonNull::new(unsafe { mem.cast::<*mut u8>().as_ptr().read() });
        }
        n
    }
}

/// One resource's line in a group's stat.
#[derive(Clone, Copy)]
pub(crate) struct PressureRow {
    name: Name,
    usage: usize,
    t: Thresholds,
    under: bool,
    entered: usize,
    refused: usize,
}

impl PressureRow {
    const EMPTY: PressureRow =
        PressureRow { name: Name::EMPTY, usage: 0, t: Thresholds::UNLIMITED, under: false, entered: 0, refused: 0 };
}

impl fmt::Display for PressureRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pressure {} usage {} min {} pressure {} max {} state {} entered {} refused {}",
            self.name.as_str(),
            self.usage,
            self.t.min,
            self.t.pressure,
            self.t.max,
            if self.under { "pressure" } else { "normal" },
            self.entered,
            self.refused
        )
    }
}
