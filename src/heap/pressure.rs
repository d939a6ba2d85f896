//! Named pressure resources of groups: the handle API.

use core::fmt;
use core::ptr::NonNull;

use lock_api::RawMutex;

use super::groups::Cgroup;
use crate::cgroup::{Group, MAX_PRESSURES, SLOT_EMPTY, SLOT_LIVE};
use crate::counter::{PressureCounter, PressureState, Thresholds};
use crate::error::{Error, Name};
use crate::platform::{DefaultPlatform, DefaultRawMutex, DefaultSource, PageSource, Platform};
use crate::sync::Ordering;

impl<'k, S: PageSource, R: RawMutex, P: Platform> Cgroup<'k, S, R, P> {
    /// The group's pressure resource `name` (e.g. `"tcp"`), created with
    /// `thresholds` (bytes) if it does not exist, else re-tuned to them.
    ///
    /// Charges propagate to the same-named resource of every ancestor that
    /// has one, and none of the three thresholds may exceed the nearest
    /// such ancestor's `max` (the admin sets the max, the container tunes
    /// the rest, seed 003). Errors: [`Error::BadThresholds`],
    /// [`Error::AboveParentMax`], [`Error::TooManyResources`],
    /// [`Error::Removed`], name errors; re-tuning below the current usage
    /// gives [`Error::LimitBelowUsage`].
    pub fn pressure(&self, name: &str, thresholds: Thresholds) -> Result<Pressure<'k, S, R, P>, Error> {
        let name = Name::new(name)?;
        if !thresholds.is_ordered() {
            return Err(Error::BadThresholds);
        }
        let k = self.kmem();
        let g = self.group_ref();
        let _tree = k.tree_lock.lock();
        if g.is_offline() {
            return Err(Error::Removed);
        }
        let parent = g.parent().and_then(|p| nearest(p, &name));
        if let Some(pc) = parent {
            let parent_max = pc.thresholds().max;
            if thresholds.max > parent_max {
                return Err(Error::AboveParentMax { parent_max });
            }
        }
        let slot = match g.pressures.iter().position(|s| s.get().is_some_and(|(n, _)| *n == name)) {
            Some(i) => {
                let (_, c) = g.pressures[i].get().ok_or(Error::TooManyResources)?;
                c.set_thresholds(thresholds).map_err(|usage| Error::LimitBelowUsage { usage })?;
                i
            }
            None => {
                let i = g
                    .pressures
                    .iter()
                    .position(|s| s.state.load(Ordering::Relaxed) == SLOT_EMPTY)
                    .ok_or(Error::TooManyResources)?;
                let slot = &g.pressures[i];
                let parent_ptr = parent.map_or(core::ptr::null(), |p| p as *const PressureCounter);
                // SAFETY: the slot is unpublished and we hold the tree lock,
                // so nobody else reads or writes it; the parent resource
                // lives in an ancestor group, which outlives this group.
                slot.inner.with_mut(|p| unsafe { p.write((name, PressureCounter::new(parent_ptr))) });
                slot.inner.with_mut(|p| {
                    // SAFETY: as above: still unpublished.
                    let c = unsafe { &(*p).1 };
                    c.set_thresholds(thresholds).map_err(|usage| Error::LimitBelowUsage { usage })
                })?;
                slot.state.store(SLOT_LIVE, Ordering::Release);
                i
            }
        };
        let counter = match g.pressures[slot].get() {
            Some((_, c)) => NonNull::from(c),
            None => return Err(Error::TooManyResources),
        };
        Ok(Pressure { _group: self.clone(), counter })
    }
}

/// The nearest resource named `name` from `g` up.
fn nearest<'a, R: RawMutex>(g: &'a Group<R>, name: &Name) -> Option<&'a PressureCounter> {
    let mut cur = Some(g);
    while let Some(x) = cur {
        if let Some(c) = x.pressure(name) {
            return Some(c);
        }
        cur = x.parent();
    }
    None
}

/// A group's named pressure resource; see [`Cgroup::pressure`]. Amounts
/// are in bytes.
pub struct Pressure<'k, S: PageSource = DefaultSource, R: RawMutex = DefaultRawMutex, P: Platform = DefaultPlatform> {
    /// Keeps the group, and so its resource, alive.
    _group: Cgroup<'k, S, R, P>,
    counter: NonNull<PressureCounter>,
}

// SAFETY: the counter is all atomics, and the group handle is Send/Sync.
unsafe impl<S: PageSource, R: RawMutex + Sync, P: Platform> Send for Pressure<'_, S, R, P> {}
// SAFETY: as above.
unsafe impl<S: PageSource, R: RawMutex + Sync, P: Platform> Sync for Pressure<'_, S, R, P> {}

impl<S: PageSource, R: RawMutex, P: Platform> Pressure<'_, S, R, P> {
    #[inline]
    fn counter(&self) -> &PressureCounter {
        // SAFETY: a published slot of a group this handle keeps alive.
        unsafe { self.counter.as_ref() }
    }

    /// Charges `bytes`; returns the state it leaves the group in. A
    /// `Refused` charge charged nothing.
    #[inline]
    pub fn charge(&self, bytes: usize) -> PressureState {
        self.counter().charge(bytes)
    }

    /// Gives back `bytes` charged before. More than this group's resource
    /// holds is refused with [`Error::UnchargeAboveUsage`] and changes
    /// nothing.
    #[inline]
    pub fn uncharge(&self, bytes: usize) -> Result<(), Error> {
        self.counter().uncharge(bytes).map_err(|usage| Error::UnchargeAboveUsage { usage })
    }

    /// Bytes charged here and in descendants.
    pub fn usage(&self) -> usize {
        self.counter().usage()
    }

    /// The largest usage an accepted charge left (never above `max`;
    /// `usage` read during a refused charge may briefly be higher).
    pub fn peak(&self) -> usize {
        self.counter().peak()
    }

    /// The state now (this level or an ancestor under pressure).
    pub fn state(&self) -> PressureState {
        self.counter().state()
    }

    /// The thresholds.
    pub fn thresholds(&self) -> Thresholds {
        self.counter().thresholds()
    }

    /// Times this level entered pressure.
    pub fn entered(&self) -> usize {
        self.counter().entered.get()
    }

    /// Charges refused at this level.
    pub fn refused(&self) -> usize {
        self.counter().refused.get()
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> fmt::Debug for Pressure<'_, S, R, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pressure")
            .field("usage", &self.usage())
            .field("thresholds", &self.thresholds())
            .field("state", &self.state())
            .finish()
    }
}

/// One resource's line in a group's stat.
#[derive(Clone, Copy)]
pub(crate) struct PressureRow {
    pub(crate) name: Name,
    pub(crate) usage: usize,
    pub(crate) t: Thresholds,
    pub(crate) under: bool,
    pub(crate) entered: usize,
    pub(crate) refused: usize,
}

impl PressureRow {
    pub(crate) const EMPTY: PressureRow =
        PressureRow { name: Name::EMPTY, usage: 0, t: Thresholds::UNLIMITED, under: false, entered: 0, refused: 0 };
}

/// Snapshots of `g`'s resources.
pub(crate) fn rows<R: RawMutex>(g: &Group<R>) -> ([PressureRow; MAX_PRESSURES], usize) {
    let mut out = [PressureRow::EMPTY; MAX_PRESSURES];
    let mut n = 0;
    for (name, c) in g.pressures.iter().filter_map(|s| s.get()) {
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

#[cfg(all(test, not(loom)))]
mod tests;
