//! Named pressure resources of groups: the handle API.

use core::fmt;
use core::ptr::NonNull;

use super::Cgroup;
use crate::counter::{PressureCounter, PressureState, Thresholds};
use crate::error::{Error, Name};
use crate::heap::{Heap, Kmem};

impl<'k, K: Heap> Cgroup<'k, K> {
    /// The group's pressure resource `name` (e.g. `"tcp"`), created with
    /// `thresholds` (bytes) if it does not exist, else re-tuned to them.
    ///
    /// Charges propagate to the same-named resource of every ancestor: an
    /// ancestor that has none gets one here, unlimited
    /// ([`Thresholds::UNLIMITED`]; tune it later by calling this on the
    /// ancestor, which then counts what its descendants charged). A
    /// resource opened here lives as long as its group; one an ancestor
    /// got for its descendants goes once the last of them has gone (their
    /// groups freed), so short-lived groups with names of their own leave
    /// nothing behind at the root. None of
    /// the three thresholds may exceed an ancestor's `max` (the admin sets
    /// the max, the container tunes the rest, seed 003). Errors: [`Error::BadThresholds`],
    /// [`Error::AboveParentMax`], [`Error::Removed`],
    /// [`Error::OutOfMemory`] (a new resource's few dozen bytes of
    /// metadata could not be had), name errors; re-tuning below the
    /// current usage gives [`Error::LimitBelowUsage`]. A group may hold
    /// any number of resources.
    pub fn pressure(&self, name: &str, thresholds: Thresholds) -> Result<Pressure<'k, K>, Error> {
        let name = Name::new(name)?;
        let counter = self.kmem().tree().open_pressure(self.kmem(), self.g(), name, thresholds)?;
        Ok(Pressure { _group: self.clone(), counter })
    }
}

/// A group's named pressure resource; see [`Cgroup::pressure`]. Amounts
/// are in bytes. What it still holds when its group goes (removed, with
/// its last handle dropped) is given back to its ancestors' resources.
pub struct Pressure<'k, K: Heap = Kmem> {
    /// Keeps the group, and so its resource, alive.
    _group: Cgroup<'k, K>,
    counter: NonNull<PressureCounter>,
}

// SAFETY: the counter is all atomics, and the group handle is Send/Sync.
unsafe impl<K: Heap<Lock: Sync>> Send for Pressure<'_, K> {}
// SAFETY: as above.
unsafe impl<K: Heap<Lock: Sync>> Sync for Pressure<'_, K> {}

impl<K: Heap> Pressure<'_, K> {
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

    /// Gives back `bytes` charged before through this group's resource.
    /// More than was charged through it (bytes its descendants charged are
    /// theirs to give back) is refused with [`Error::UnchargeAboveUsage`]
    /// (with what was) and changes nothing.
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

impl<K: Heap> fmt::Debug for Pressure<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pressure")
            .field("usage", &self.usage())
            .field("thresholds", &self.thresholds())
            .field("state", &self.state())
            .finish()
    }
}
