//! Reports: `/proc/slabinfo`-style tables and allocator counters.
//!
//! Reports read each cache's counters under its node locks, one cache at a
//! time, and hold no lock while writing to the formatter: the sink may well
//! allocate from this very allocator.

use core::fmt;

use lock_api::RawMutex;

use super::{Heap, Kmem, KmemOf};
use crate::magazine::{MagCache, MagazineStats};
use crate::platform::{PageSource, Platform, SourceStats};
use crate::slab::classes::{CLASS_SIZES, NCLASSES};
use crate::slab::{Cache, CacheStats, Geometry};
use crate::sync::Ordering;

/// A `/proc/slabinfo`-like table; see [`Kmem::slabinfo`].
pub struct SlabInfo<'a, K: Heap = Kmem> {
    kmem: &'a KmemOf<K>,
}

/// Allocator-wide counters; see [`Kmem::stats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KmemStats {
    /// The page source's counters.
    pub source: SourceStats,
    /// Live objects on the page path (larger than the largest class).
    pub large_objects: usize,
    /// Pages those objects hold.
    pub large_pages: usize,
    /// Frees of pointers that no cache owns, detected and ignored (debug
    /// builds check every free).
    pub bad_frees: usize,
    /// Freed objects waiting in the detection quarantine, and their bytes
    /// (see [`crate::Detection`]).
    pub quarantined: (usize, usize),
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// A `/proc/slabinfo`-style report: one row per cache, whitespace
    /// separated, columns `name active_objs num_objs objsize objperslab
    /// pagesperslab num_slabs limit depot_full depot_empty pages group`,
    /// one row per cache and, for accounted caches, one for the charged
    /// cache every group's objects of it come from (`group` is `/` for the
    /// root, `*` for a charged cache, `-` for the allocator's own caches), where
    /// `limit` is the rounds per magazine and `active_objs` counts objects
    /// out of the slabs (live or cached in magazines), as Linux does. A
    /// typed cache dropped while leaked objects keep its slabs stays, and
    /// its rows (and its charged cache's) are listed as `name(dead)`.
    pub fn slabinfo(&self) -> SlabInfo<'_, Self> {
        SlabInfo { kmem: self }
    }

    /// Allocator-wide counters.
    pub fn stats(&self) -> KmemStats {
        KmemStats {
            source: self.source.stats(),
            large_objects: self.large_allocs.get(),
            large_pages: self.large_pages.get(),
            bad_frees: self.bad_frees.get(),
            quarantined: self.quarantined(),
        }
    }
}

/// A cache name rendered on the stack, so it can be padded without allocating.
struct NameBuf {
    buf: [u8; 48],
    len: usize,
}

impl fmt::Write for NameBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Truncate at a character boundary rather than fail the report.
        let mut take = s.len().min(self.buf.len() - self.len);
        while !s.is_char_boundary(take) {
            take -= 1;
        }
        self.buf[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}

/// The columns of one row, snapshotted before anything is written.
struct Row {
    slabs: CacheStats,
    mags: MagazineStats,
    geo: Geometry,
}

impl Row {
    fn of_plain<R: RawMutex>(c: &Cache<R>) -> Row {
        Row { slabs: c.stats(), mags: MagazineStats::default(), geo: *c.geometry() }
    }
    fn of<R: RawMutex>(c: &MagCache<R>) -> Row {
        let (slabs, mags) = c.stats();
        Row { slabs, mags, geo: *c.cache.geometry() }
    }
}

const HEADER_ROW: [&str; 12] = [
    "# name",
    "active_objs",
    "num_objs",
    "objsize",
    "objperslab",
    "pagesperslab",
    "num_slabs",
    "limit",
    "depot_full",
    "depot_empty",
    "pages",
    "group",
];

fn row(f: &mut fmt::Formatter<'_>, name: fmt::Arguments<'_>, r: Row, group: &str) -> fmt::Result {
    let mut nb = NameBuf { buf: [0; 48], len: 0 };
    fmt::write(&mut nb, name)?;
    let name = core::str::from_utf8(&nb.buf[..nb.len]).unwrap_or("?");
    writeln!(
        f,
        "{:<24} {:>11} {:>10} {:>7} {:>10} {:>12} {:>9} {:>5} {:>10} {:>11} {:>7} {}",
        name,
        r.slabs.active_objects,
        r.slabs.total_objects,
        r.geo.size,
        r.geo.capacity,
        r.geo.slab_pages(),
        r.slabs.slabs,
        r.mags.rounds,
        r.mags.depot_full,
        r.mags.depot_empty,
        r.slabs.pages,
        group
    )
}

impl<K: Heap> fmt::Display for SlabInfo<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "slabinfo - version: kmemcg 1")?;
        let h = HEADER_ROW;
        writeln!(
            f,
            "{:<24} {:>11} {:>10} {:>7} {:>10} {:>12} {:>9} {:>5} {:>10} {:>11} {:>7} {}",
            h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11]
        )?;
        let k = self.kmem;
        let t = k.tree();
        for (c, size) in CLASS_SIZES.iter().enumerate().take(NCLASSES) {
            row(f, format_args!("kmalloc-{size}"), Row::of(&t.classes()[c]), "/")?;
        }
        row(f, format_args!("kmem_cache"), Row::of_plain(&t.descriptors), "-")?;
        row(f, format_args!("kmem_magazine"), Row::of_plain(&k.magazines), "-")?;
        row(f, format_args!("kmem_cgroup"), Row::of_plain(&t.groups), "-")?;
        row(f, format_args!("kmem_charged_cache"), Row::of_plain(&t.charged_caches), "-")?;
        row(f, format_args!("kmem_pressure"), Row::of_plain(&t.pressure_nodes), "-")?;
        let mut res = Ok(());
        // A destroyed cache whose slabs leaked objects keep stays, dead,
        // listed with a `(dead)` mark while it holds slabs, as its
        // charged cache's row is: else those pages would be in no row.
        t.for_each_desc(|desc| {
            let live = desc.live.load(Ordering::Relaxed);
            let r = Row::of(&desc.cache);
            if res.is_ok() && (live || r.slabs.slabs > 0) {
                res = row(f, format_args!("{}{}", desc.name.as_str(), dead_mark(live)), r, "/");
            }
        });
        res?;
        // One row per charged cache, named for the cache it charges for,
        // its group column `*` (every group's objects share its slabs).
        t.for_each_charged_of(|name, live, c| {
            if res.is_ok() {
                res = row(f, format_args!("{}{}", name.as_str(), dead_mark(live)), Row::of(c), "*");
            }
        });
        res
    }
}

/// What follows a destroyed cache's name in `slabinfo`.
fn dead_mark(live: bool) -> &'static str {
    if live { "" } else { "(dead)" }
}

impl fmt::Display for KmemStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "pages_in_use {}", self.source.pages_in_use)?;
        writeln!(f, "pages_reserved {}", self.source.pages_reserved)?;
        writeln!(f, "large_objects {}", self.large_objects)?;
        writeln!(f, "large_pages {}", self.large_pages)?;
        writeln!(f, "bad_frees {}", self.bad_frees)
    }
}
