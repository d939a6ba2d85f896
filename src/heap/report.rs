//! Reports: `/proc/slabinfo`-style tables and allocator counters.
//!
//! Reports read each cache's counters under its node locks, one cache at a
//! time, and hold no lock while writing to the formatter: the sink may well
//! allocate from this very allocator.

use core::fmt;
use core::ptr::NonNull;

use lock_api::RawMutex;

use super::Kmem;
use super::classes::{CLASS_SIZES, NCLASSES};
use crate::platform::{PageSource, SourceStats};
use crate::slab::{Cache, CacheStats};
use crate::sync::Ordering;

/// A `/proc/slabinfo`-like table; see [`Kmem::slabinfo`].
pub struct SlabInfo<'a, S: PageSource, R: RawMutex> {
    kmem: &'a Kmem<S, R>,
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
}

impl<S: PageSource, R: RawMutex> Kmem<S, R> {
    /// A `/proc/slabinfo`-style report: one row per cache, whitespace
    /// separated, columns `name active_objs num_objs objsize objperslab
    /// pagesperslab num_slabs`.
    pub fn slabinfo(&self) -> SlabInfo<'_, S, R> {
        SlabInfo { kmem: self }
    }

    /// Allocator-wide counters.
    pub fn stats(&self) -> KmemStats {
        KmemStats {
            source: self.source.stats(),
            large_objects: self.large_allocs.get(),
            large_pages: self.large_pages.get(),
            bad_frees: self.bad_frees.get(),
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

fn row<R: RawMutex>(f: &mut fmt::Formatter<'_>, name: fmt::Arguments<'_>, cache: &Cache<R>) -> fmt::Result {
    let mut nb = NameBuf { buf: [0; 48], len: 0 };
    fmt::write(&mut nb, name)?;
    let name = core::str::from_utf8(&nb.buf[..nb.len]).unwrap_or("?");
    // Snapshot first: the counters are read under the cache's locks, which
    // are released before anything is written.
    let st: CacheStats = cache.stats();
    let g = cache.geometry();
    writeln!(
        f,
        "{:<24} {:>10} {:>10} {:>7} {:>6} {:>5} {:>8}",
        name,
        st.active_objects,
        st.total_objects,
        g.size,
        g.capacity,
        g.slab_pages(),
        st.slabs
    )
}

impl<S: PageSource, R: RawMutex> fmt::Display for SlabInfo<'_, S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "slabinfo - version: kmemcg 1")?;
        writeln!(
            f,
            "{:<24} {:>10} {:>10} {:>7} {:>6} {:>5} {:>8}",
            "# name", "active_objs", "num_objs", "objsize", "objper", "pages", "slabs"
        )?;
        for (c, size) in CLASS_SIZES.iter().enumerate().take(NCLASSES) {
            row(f, format_args!("kmalloc-{size}"), &self.kmem.classes[c])?;
        }
        row(f, format_args!("kmem_cache"), &self.kmem.descriptors)?;
        let mut d = self.kmem.registry.load(Ordering::Acquire);
        while let Some(p) = NonNull::new(d) {
            // SAFETY: published descriptors are never freed.
            let desc = unsafe { p.as_ref() };
            if desc.live.load(Ordering::Relaxed) {
                row(f, format_args!("{}", desc.name.as_str()), &desc.cache)?;
            }
            d = desc.next;
        }
        Ok(())
    }
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
