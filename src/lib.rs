//! kmemcg: an embeddable `#![no_std]` slab allocator.
//!
//! `Kmem` serves objects from slab caches over a pluggable page source and
//! is usable as a `#[global_allocator]`, as an
//! [`allocator_api2::alloc::Allocator`], and through named typed caches.
//!
//! ```no_run
//! use kmemcg::{Kmem, OsPages};
//! #[global_allocator]
//! static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());
//! fn main() {
//!     let v: Vec<u32> = (0..1000).collect();
//!     println!("{}", KMEM.slabinfo());
//!     # drop(v);
//! }
//! ```
//!
//! # Glossary
//!
//! * **page**: 4 KiB, the unit every layer counts in ([`PAGE_SIZE`]).
//! * **run**: `2^order` contiguous pages, aligned to their size, from a
//!   [`PageSource`]; large objects get *exact* runs whose unused tail pages
//!   go straight back.
//! * **node**: a NUMA node; page sources tag runs with one, and caches keep
//!   slab lists per node.
//! * **slab**: a run cut into equal objects, with a 64-byte header at its
//!   start; the slab of an object is found by masking its address.
//! * **cache**: the slabs of one object size and alignment: a size class of
//!   the general heap, or a named typed cache ([`Kmem::create_cache`]).
//! * **size class**: one of 43 object sizes from 8 B to 16 KiB, spaced so a
//!   request wastes at most 25% of its class.
//!
//! # Layers, bottom to top
//!
//! A module uses only modules below it; imports are explicit (no globs), so
//! the order can be read off each file's `use` lines. [`Error`] is a leaf
//! every layer may name.
//!
//! | layer | module | holds |
//! | --- | --- | --- |
//! | sync | `sync` | the one place naming `core::sync::atomic` or loom |
//! | platform | `platform` | [`PageSource`], [`Region`] (buddy over handed-in memory), `OsPages` |
//! | page | `page` | exact page runs, pointer → slab lookup |
//! | slab | `slab` | caches: slabs, per-node partial/full/empty lists |
//! | heap | `heap` | [`Kmem`]: size classes, page path, typed caches, reports |
//! | global | `global` | `GlobalAlloc` and `Allocator` for [`Kmem`] |
//!
//! # Lock order
//!
//! Outer before inner; no path takes them the other way:
//!
//! 1. `Kmem::registry_lock` (cache creation and destruction only);
//! 2. a cache's per-node list lock (one slab-list update per hold);
//! 3. a page source's lock (`Region`: per node; `OsPages`: its pool).
//!
//! A cache calls its page source *without* holding its list lock when it
//! grows; it releases slabs after dropping it. Reports read counters under
//! list locks one cache at a time and write to their formatter with no lock
//! held, so a report may be formatted into memory from this allocator.
//! Locks are [`lock_api::RawMutex`] implementations chosen by the user
//! (`spin` by default): a kernel passes one that masks interrupts.
//!
//! # Atomics
//!
//! | field | written by | ordering | paired with |
//! | --- | --- | --- | --- |
//! | `Region::spans[n]` | `Region::add_raw`, after writing the span entry | `Release` | `Acquire` in `Region::node_of` |
//! | `Kmem::registry` | `create_cache`, after writing the descriptor | `Release` | `Acquire` in reports and `shrink` |
//! | `CacheDesc::live` | create/destroy, under `registry_lock` | `Relaxed` | readers under the lock; reports tolerate a stale flag (rows of a cache being destroyed) |
//! | statistics (`Stat`) | many | `Relaxed` | nothing: never used for a safety decision |
//!
//! # Bad input
//!
//! Zero-size layouts, sizes near `isize::MAX`, sizes whose rounding
//! overflows, alignments above a page (served by the page path) and an
//! exhausted page source give null from `GlobalAlloc`, `AllocError` from
//! the `Allocator`, or an [`Error`] from typed APIs, and leave every live
//! object intact. Debug builds check every free: a pointer that no cache
//! owns is ignored and counted in [`KmemStats::bad_frees`].

#![no_std]
// Loom builds compile only the layers below `heap`, so much of the crate
// is unused there.
#![cfg_attr(loom, allow(dead_code, unused_imports))]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

#[cfg(any(feature = "std", test))]
extern crate std;

mod error;
mod sync;
#[cfg(all(test, not(loom)))]
mod testutil;

mod platform;

mod counter;

mod page;

mod slab;

mod magazine;

#[cfg(not(loom))]
mod cgroup;

#[cfg(not(loom))]
mod heap;

#[cfg(not(loom))]
mod global;

#[cfg(all(test, loom))]
mod tests;

pub use counter::{PageCounter, STOCK_BATCH, STOCK_MAX};
pub use error::{Error, GroupName, NAME_MAX};
#[cfg(not(loom))]
pub use heap::{
    CacheBox, CacheFlags, Cgroup, CgroupAllocator, CgroupGuard, GroupStat, Kmem, KmemCache, KmemStats, MAX_CLASS_SIZE,
    SlabInfo,
};
pub use magazine::MagazineStats;
#[cfg(all(feature = "std", not(loom)))]
pub use platform::OsPages;
#[cfg(all(feature = "std", not(loom)))]
pub use platform::Threads;
pub use platform::{
    DefaultPlatform, DefaultRawMutex, MAX_CPUS, MAX_NODES, MAX_ORDER, NoCpus, Ownership, PAGE_SHIFT, PAGE_SIZE,
    PageRun, PageSource, Platform, Region, RegionError, SourceStats, order_for_pages,
};
pub use slab::CacheStats;
