//! Named pressure resources of a group (see `counter::pressure`).

use core::fmt;
use core::ptr::{self, NonNull};

use lock_api::RawMutex;

use super::{Group, Tree};
use crate::counter::{PressureCounter, Thresholds};
use crate::error::{Error, Name};
use crate::sync::{AtomicU8, Ordering, UnsafeCell, atomic_u8, loom_const_fn};

/// Named pressure resources one group can hold; a fifth name gives
/// [`crate::Error::TooManyResources`]. Resources live as long as their group.
pub const MAX_PRESSURES: usize = 4;

/// `PressureSlot::state`: unused.
const SLOT_EMPTY: u8 = 0;
/// `PressureSlot::state`: published; `inner` is fixed except for atomics.
const SLOT_LIVE: u8 = 2;

/// One named pressure resource of a group. `inner` is written once, under
/// the tree lock, before `state` becomes `SLOT_LIVE` with `Release`;
/// readers load `state` with `Acquire` first.
pub(super) struct PressureSlot {
    state: AtomicU8,
    inner: UnsafeCell<(Name, PressureCounter)>,
}

impl PressureSlot {
    loom_const_fn! {
        pub(super) fn new() -> Self {
            PressureSlot {
                state: atomic_u8(SLOT_EMPTY),
                // SAFETY: a null parent is always valid.
                inner: UnsafeCell::new((Name::EMPTY, unsafe { PressureCounter::new(ptr::null()) })),
            }
        }
    }

    /// The name and counter, once published.
    fn get(&self) -> Option<(&Name, &PressureCounter)> {
        if self.state.load(Ordering::Acquire) != SLOT_LIVE {
            return None;
        }
        // SAFETY: published slots are never written again (their counter
        // is all atomics).
        self.inner.with_mut(|p| unsafe { Some((&(*p).0, &(*p).1)) })
    }
}

impl<R: RawMutex> Group<R> {
    /// The published pressure resource `name`, if any.
    fn pressure(&self, name: &Name) -> Option<&PressureCounter> {
        self.pressures.iter().filter_map(PressureSlot::get).find(|(n, _)| *n == name).map(|(_, c)| c)
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

    /// Snapshots of the group's resources.
    pub(crate) fn pressure_rows(&self) -> ([PressureRow; MAX_PRESSURES], usize) {
        let mut out = [PressureRow::EMPTY; MAX_PRESSURES];
        let mut n = 0;
        for (name, c) in self.pressures.iter().filter_map(|s| s.get()) {
            out[n] = PressureRow {
                name: *name,
                usage: c.usage(),
                t: c.thresholds(),
                under: c.under_pressure(),
                entered: c.entered.get(),
                refused: c.refused.get(),
            };
            n += 1;
        }
        (out, n)
    }
}

impl<R: RawMutex> Tree<R> {
    /// Group `g`'s pressure resource `name`, created with `thresholds` if
    /// it does not exist, else re-tuned to them (see `Cgroup::pressure`).
    /// It lives as long as the group.
    pub(crate) fn open_pressure(
        &self,
        g: &Group<R>,
        name: Name,
        thresholds: Thresholds,
    ) -> Result<NonNull<PressureCounter>, Error> {
        if !thresholds.is_ordered() {
            return Err(Error::BadThresholds);
        }
        let _tree = self.lock.lock();
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
        let below_usage = |usage| Error::LimitBelowUsage { usage };
        if let Some(c) = g.pressure(&name) {
            c.set_thresholds(thresholds).map_err(below_usage)?;
            return Ok(NonNull::from(c));
        }
        let slot = g
            .pressures
            .iter()
            .find(|s| s.state.load(Ordering::Relaxed) == SLOT_EMPTY)
            .ok_or(Error::TooManyResources)?;
        let parent_ptr = parent.map_or(ptr::null(), |p| p as *const PressureCounter);
        slot.inner.with_mut(|p| {
            // SAFETY: the slot is unpublished and we hold the tree lock, so
            // nobody else reads or writes it; the parent resource lives in
            // an ancestor group, which outlives this group.
            unsafe { p.write((name, PressureCounter::new(parent_ptr))) };
            // SAFETY: as above: still unpublished.
            unsafe { &(*p).1 }.set_thresholds(thresholds).map_err(below_usage)
        })?;
        slot.state.store(SLOT_LIVE, Ordering::Release);
        slot.get().map(|(_, c)| NonNull::from(c)).ok_or(Error::TooManyResources)
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
