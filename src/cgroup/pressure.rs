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
use crate::sync::{AtomicPtr, Ordering, atomic_null};

/// The most pressure rows a group's stat shows (the first made); a group
/// may hold any number of resources.
pub(crate) const STAT_PRESSURES: usize = 8;

/// One named pressure resource of a group: a node of the group's list,
/// an object of the tree's `pressure_nodes` cache, freed with the group.
/// Written whole before it is linked (`Release`); never written again but
/// through its counter's atomics.
pub(crate) struct PressureNode {
    next: AtomicPtr<PressureNode>,
    name: Name,
    counter: PressureCounter,
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
}

impl<R: RawMutex> Group<R> {
    /// The group's resources, first made first.
    fn pressure_nodes(&self) -> impl Iterator<Item = &PressureNode> {
        let mut cur = self.pressures.load(Ordering::Acquire);
        core::iter::from_fn(move || {
            // SAFETY: linked nodes live as long as their group.
            let n = unsafe { NonNull::new(cur)?.as_ref() };
            cur = n.next.load(Ordering::Acquire);
            Some(n)
        })
    }

    /// The resource `name`, if any.
    fn pressure(&self, name: &Name) -> Option<&PressureCounter> {
        self.pressure_nodes().find(|n| n.name == *name).map(|n| &n.counter)
    }

    /// The nearest resource named `name` from this group up.
    fn nearest_pressure(&self, name: &Name) -> Option<&PressureCounter> {
        let mut cur = Some(self);
        while let Some(x) = cur {
            if let Some(c) = x.pressure(name) {
                return Some(c);
            }
            cur = x.parent();
        }
        None
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
        let below_usage = |usage| Error::LimitBelowUsage { usage };
        // A new resource's node, made before the tree lock is taken (the
        // allocation may reclaim, which takes it); freed if not needed.
        let mut node: Option<NonNull<u8>> = None;
        loop {
            let _tree = self.lock.lock();
            let found = (|| {
                if g.is_offline() {
                    return Err(Error::Removed);
                }
                let parent = g.parent().and_then(|p| p.nearest_pressure(&name));
                if let Some(pc) = parent {
                    let parent_max = pc.thresholds().max;
                    if thresholds.max > parent_max {
                        return Err(Error::AboveParentMax { parent_max });
                    }
                }
                if let Some(c) = g.pressure(&name) {
                    c.set_thresholds(thresholds).map_err(below_usage)?;
                    return Ok(Some(NonNull::from(c)));
                }
                let Some(mem) = node else { return Ok(None) };
                let n = mem.cast::<PressureNode>();
                let parent_ptr = parent.map_or(ptr::null(), |p| p as *const PressureCounter);
                // SAFETY: a fresh object of the node cache, sized and
                // aligned for a node, unpublished; the parent resource
                // lives in an ancestor group, which outlives this group.
                unsafe {
                    n.as_ptr().write(PressureNode {
                        next: atomic_null(),
                        name,
                        counter: PressureCounter::new(parent_ptr),
                    });
                    if let Err(e) = n.as_ref().counter.set_thresholds(thresholds).map_err(below_usage) {
                        n.as_ptr().drop_in_place();
                        return Err(e);
                    }
                }
                // Linked last, so the list stays in the order made.
                let mut link = &g.pressures;
                while let Some(last) = NonNull::new(link.load(Ordering::Relaxed)) {
                    // SAFETY: a linked node, alive with its group.
                    link = unsafe { &last.as_ref().next };
                }
                // Release: the node is written before it can be seen.
                link.store(n.as_ptr(), Ordering::Release);
                node = None;
                // SAFETY: just linked; lives as long as the group.
                Ok(Some(NonNull::from(unsafe { &n.as_ref().counter })))
            })();
            let r = match found {
                Ok(None) => {
                    drop(_tree);
                    node = Some(self.alloc_meta(env, &self.pressure_nodes).ok_or(Error::OutOfMemory)?);
                    continue;
                }
                Ok(Some(c)) => Ok(c),
                Err(e) => Err(e),
            };
            if let Some(mem) = node {
                // SAFETY: ours and not linked (a node written and refused
                // was dropped again): unused.
                unsafe { self.pressure_nodes.free(&Pages::plain(env.src()), mem) };
            }
            return r;
        }
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
