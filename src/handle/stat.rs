//! A group's statistics: [`GroupStat`], its events, and the
//! `memory.stat`-like text it prints.

use core::fmt;

use super::cgroup::{Cgroup, to_bytes};
use crate::cgroup::{Event, PressureRow, STAT_PRESSURES, class_name};
use crate::error::{GroupName, Name};
use crate::heap::{Heap, LeakSizes};
use crate::magazine::MagCache;
use crate::platform::{MAX_NODES, PAGE_SIZE};

impl<'k, K: Heap> Cgroup<'k, K> {
    /// A `memory.stat`-like snapshot.
    pub fn stat(&self) -> GroupStat {
        let g = self.g();
        let c = g.counter();
        let ev = g.events();
        let t = self.kmem().tree();
        let mut st = GroupStat {
            name: GroupName(*g.name()),
            usage: self.usage(),
            peak: self.peak(),
            max: self.max(),
            high: to_bytes(c.high()),
            soft_limit: to_bytes(c.soft()),
            low: to_bytes(c.low()),
            min: to_bytes(c.min()),
            failcnt: c.failcnt(),
            events: EventCounts::of(|e| ev.hierarchical(e)),
            events_local: EventCounts::of(|e| ev.local(e)),
            soft_reclaim_passes: ev.soft.get(),
            soft_reclaim_bytes: to_bytes(ev.soft_pages.get()),
            throttled: ev.throttled.get(),
            throttled_us: ev.throttled_us.get(),
            overdrafts: ev.overdrafts.get(),
            overdraft_bytes: to_bytes(ev.overdraft_pages.get()),
            stocked: to_bytes(c.stocked()),
            nodes: t.node_bytes(g),
            large: to_bytes(g.large_pages().get()),
            injected: t.injected(g),
            caches: [CacheRow::EMPTY; STAT_CACHES],
            ncaches: 0,
            pressures: {
                // Nodes unlinked meanwhile are not freed under the walk.
                let _read = t.read_guard();
                g.pressure_rows()
            },
        };
        let kmem = self.kmem();
        // With detection on, the requested sizes of the live objects of a
        // row (none with it off: no walk then).
        let mut add = |name: Name, objects: usize, pages: usize, cache: &MagCache<K::Lock>, owner: Option<*mut ()>| {
            if st.ncaches < STAT_CACHES && pages > 0 {
                let sizes = if objects > 0 { kmem.leak_sizes(cache, owner) } else { LeakSizes::EMPTY };
                st.caches[st.ncaches] = CacheRow { name, objects, pages, sizes };
                st.ncaches += 1;
            }
        };
        if t.is_root(g) {
            t.classes().iter().enumerate().for_each(|(c, cache): (usize, &MagCache<K::Lock>)| {
                let s = cache.cache.stats();
                add(class_name(c), s.active_objects, s.pages, cache, None)
            });
            st.large = to_bytes(self.kmem().stats().large_pages);
        } else {
            // The group's objects of each charged cache, found by their
            // owner words; pages are what their bytes round up to.
            let key = g.key();
            t.for_each_charged(|name, cache| {
                let mut objects = 0;
                cache.cache.for_each_allocated(|_, o, _| objects += (o == key) as usize);
                add(name, objects, (objects * cache.cache.geometry().size).div_ceil(PAGE_SIZE), cache, Some(key));
            });
        }
        st
    }
}

/// How many times each [`Event`] happened, in a group alone or in its
/// subtree (see [`GroupStat::events`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventCounts {
    /// A charge would have gone over `max` (reclaim ran).
    pub max: usize,
    /// A charge failed at `max` even after reclaim.
    pub oom: usize,
    /// An allocating task reclaimed because usage was above `high`.
    pub high: usize,
    /// Reclaimed while within the effective `low`, because nothing
    /// unprotected was left (its `low` is overcommitted, or memory too
    /// tight for it).
    pub low: usize,
    /// Reclaimed while within its own `min`: by reclaim for its own `max`
    /// or `high`, or [`Cgroup::reclaim`] on it (reclaim for others never
    /// does).
    pub min: usize,
}

impl EventCounts {
    /// The counts `count` gives for each event.
    fn of(count: impl Fn(Event) -> usize) -> EventCounts {
        EventCounts {
            max: count(Event::Max),
            oom: count(Event::Oom),
            high: count(Event::High),
            low: count(Event::Low),
            min: count(Event::Min),
        }
    }

    /// The count of `e`.
    pub fn get(&self, e: Event) -> usize {
        match e {
            Event::Max => self.max,
            Event::Oom => self.oom,
            Event::High => self.high,
            Event::Low => self.low,
            Event::Min => self.min,
        }
    }
}

/// One accounted cache's line in a [`GroupStat`].
#[derive(Clone, Copy)]
struct CacheRow {
    name: Name,
    objects: usize,
    pages: usize,
    /// Its live objects' requested sizes (detection on).
    sizes: LeakSizes,
}

impl CacheRow {
    const EMPTY: CacheRow = CacheRow { name: Name::EMPTY, objects: 0, pages: 0, sizes: LeakSizes::EMPTY };
}

/// A `memory.stat`-like snapshot of a group; `Display` writes one
/// `key value` pair per line (sizes in bytes, `max` for no limit; events
/// as `events_<name>` and `events_local_<name>`), then one
/// `slab <cache> <objects> <pages>` line per cache, and with memory-error
/// detection on, after it one `leak <cache> <bytes> <objects>` line per
/// requested size of its live objects (see [`GroupStat::leaks`]), each
/// followed, with [`Detection::sites`](crate::Detection::sites) on, by
/// the allocation site of the first such object.
#[derive(Clone, Copy)]
pub struct GroupStat {
    /// The group's name.
    pub name: GroupName,
    /// Bytes charged (group and descendants).
    pub usage: usize,
    /// Largest usage since the last reset.
    pub peak: usize,
    /// Hard limit.
    pub max: usize,
    /// Throttling threshold.
    pub high: usize,
    /// Soft limit.
    pub soft_limit: usize,
    /// Soft protection (see [`Cgroup::set_low`]).
    pub low: usize,
    /// Hard protection (see [`Cgroup::set_min`]).
    pub min: usize,
    /// Charges refused at this group.
    pub failcnt: usize,
    /// Events of the group and its descendants, removed ones included
    /// (Linux `memory.events`).
    pub events: EventCounts,
    /// Events of the group itself (Linux `memory.events.local`).
    pub events_local: EventCounts,
    /// Soft-limit reclaim passes run on this group.
    pub soft_reclaim_passes: usize,
    /// Bytes those passes freed.
    pub soft_reclaim_bytes: usize,
    /// Times a task was delayed because this group stayed above its `high`
    /// after reclaim (see [`Cgroup::set_high`]), and the delays' total in
    /// microseconds.
    pub throttled: usize,
    /// See [`GroupStat::throttled`].
    pub throttled_us: usize,
    /// Charges this group's `max` refused that a callback of the
    /// allocator (a shrinker, the event hook, the out-of-memory handler)
    /// made anyway, past the `max` by at most
    /// [`RECLAIM_OVERDRAFT`](crate::RECLAIM_OVERDRAFT) pages (Linux lets a
    /// task in reclaim, `PF_MEMALLOC`, go past `memory.max`), and their
    /// bytes.
    pub overdrafts: usize,
    /// See [`GroupStat::overdrafts`].
    pub overdraft_bytes: usize,
    /// Bytes pre-charged in CPU stocks.
    pub stocked: usize,
    /// Bytes of the group and its descendants on each NUMA node (Linux
    /// `memory.numa_stat`): their objects' bytes by the node of their slab,
    /// and their large objects' pages; for the root, the slabs and large
    /// objects it holds. Stocked bytes, and the rest of the last page of a
    /// group's objects, back nothing, so the nodes sum to at most `usage`.
    pub nodes: [usize; MAX_NODES],
    /// Bytes of large objects (with their header pages) charged here.
    pub large: usize,
    /// Allocations fault injection failed ([`Cgroup::inject_faults`]).
    pub injected: usize,
    caches: [CacheRow; STAT_CACHES],
    ncaches: usize,
    /// The first [`STAT_PRESSURES`] resources, and how many there are.
    pressures: ([PressureRow; STAT_PRESSURES], usize),
}

impl GroupStat {
    /// `(cache name, objects, pages)` of each cache the group has objects
    /// of (the first 64): for the root, its own caches'
    /// objects out of the slabs and their slabs' pages; for another group,
    /// its live objects of each accounted cache and the pages their bytes
    /// round up to (they share slabs with other groups').
    pub fn caches(&self) -> impl Iterator<Item = (&str, usize, usize)> {
        self.caches[..self.ncaches].iter().map(|r| (r.name.as_str(), r.objects, r.pages))
    }

    /// With memory-error detection on, `(cache name, requested bytes,
    /// objects)` of the group's live objects, read from their headers:
    /// what [`Cgroup::check_empty`] found left is the code under test's, in
    /// the sizes it asked for (a 24-byte object is served by `kmalloc-64`
    /// with its header and red zones). Up to four sizes a cache;
    /// `(cache, 0, n)`: `n` objects of further sizes. Empty with detection
    /// off.
    pub fn leaks(&self) -> impl Iterator<Item = (&str, usize, usize)> {
        self.caches[..self.ncaches].iter().flat_map(|r| {
            let other = (r.sizes.other > 0).then_some((0, r.sizes.other));
            r.sizes.iter().chain(other).map(move |(bytes, n)| (r.name.as_str(), bytes, n))
        })
    }
}

/// Cache rows a [`GroupStat`] keeps.
pub(crate) const STAT_CACHES: usize = 64;

fn limit(f: &mut fmt::Formatter<'_>, key: &str, v: usize) -> fmt::Result {
    if v >= usize::MAX / PAGE_SIZE * PAGE_SIZE { writeln!(f, "{key} max") } else { writeln!(f, "{key} {v}") }
}

impl fmt::Display for GroupStat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "group {}", self.name)?;
        writeln!(f, "usage {}", self.usage)?;
        writeln!(f, "peak {}", self.peak)?;
        limit(f, "max", self.max)?;
        limit(f, "high", self.high)?;
        limit(f, "soft_limit", self.soft_limit)?;
        writeln!(f, "low {}", self.low)?;
        writeln!(f, "min {}", self.min)?;
        writeln!(f, "failcnt {}", self.failcnt)?;
        for e in Event::ALL {
            writeln!(f, "events_{} {}", e.name(), self.events.get(e))?;
        }
        for e in Event::ALL {
            writeln!(f, "events_local_{} {}", e.name(), self.events_local.get(e))?;
        }
        writeln!(f, "soft_reclaim_passes {}", self.soft_reclaim_passes)?;
        writeln!(f, "soft_reclaim_bytes {}", self.soft_reclaim_bytes)?;
        writeln!(f, "throttled {}", self.throttled)?;
        writeln!(f, "throttled_us {}", self.throttled_us)?;
        writeln!(f, "overdrafts {}", self.overdrafts)?;
        writeln!(f, "overdraft_bytes {}", self.overdraft_bytes)?;
        writeln!(f, "stocked {}", self.stocked)?;
        write!(f, "usage_nodes")?;
        for (node, bytes) in self.nodes.iter().enumerate() {
            write!(f, " N{node}={bytes}")?;
        }
        writeln!(f)?;
        writeln!(f, "large {}", self.large)?;
        writeln!(f, "injected {}", self.injected)?;
        for r in &self.caches[..self.ncaches] {
            writeln!(f, "slab {} {} {}", r.name.as_str(), r.objects, r.pages)?;
            for (bytes, n, slot) in r.sizes.iter_slots() {
                writeln!(f, "leak {} {bytes} {n}", r.name.as_str())?;
                // With sites recorded, where the first of them was
                // allocated (as the table holds it when this prints).
                crate::heap::write_leak_site(f, slot)?;
            }
            if r.sizes.other > 0 {
                writeln!(f, "leak {} other {}", r.name.as_str(), r.sizes.other)?;
            }
        }
        let (rows, n) = &self.pressures;
        for row in &rows[..(*n).min(STAT_PRESSURES)] {
            writeln!(f, "{row}")?;
        }
        if *n > STAT_PRESSURES {
            writeln!(f, "pressure_more {}", n - STAT_PRESSURES)?;
        }
        Ok(())
    }
}

impl fmt::Debug for GroupStat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
