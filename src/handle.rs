//! Handle layer: the public handles over a [`Kmem`], each generic over
//! one [`Heap`] parameter (the `Kmem` type).
//!
//! | file | holds |
//! | --- | --- |
//! | `cgroup` | [`Cgroup`] (limits, children, removal, statistics), [`CgroupGuard`] (entering a group), [`CgroupAllocator`]; [`Kmem::root`] and the current group |
//! | `pressure` | [`Pressure`]: a group's named pressure resource |
//! | `typed` | [`KmemCache`] and [`CacheBox`]: named caches of one type ([`Kmem::create_cache`]) |
//!
//! A handle holds a reference on its group (or owns its cache) and
//! forwards to the cgroup layer's tree; none keeps state of its own.

mod cgroup;
mod pressure;
mod stat;
mod typed;

pub use cgroup::{AtomicScope, Cgroup, CgroupAllocator, CgroupGuard};
pub use pressure::Pressure;
pub use stat::{EventCounts, GroupStat};
pub use typed::{CacheBox, CacheFlags, KmemCache};

#[cfg(doc)]
use crate::heap::{Heap, Kmem};
