//! Hands the device tree's `/memory`, minus the kernel image (stacks and
//! page tables included) and the device tree blob and its reservations,
//! to the heaps.

use kmemcg::PAGE_SIZE;

use super::dtb::{DeviceTree, MAX_RANGES, Range};
use super::serial::kprintln;
use kernel_common::numa;

use super::arch::Aarch64;
use super::{KMEM, SOLO};

/// The boot code maps `[0, MAPPED_LIMIT)`; RAM above it is left alone.
const MAPPED_LIMIT: u64 = 4 << 30;

/// RAM for the one-CPU comparison heap, cut from the top of the largest
/// free range.
const SOLO_BYTES: u64 = 8 << 20;

/// In the NUMA boot, bytes of node 0's largest range for the global heap
/// (the kernel's own allocations); the rest goes to `KMEM_NUMA`.
const NUMA_GLOBAL_HEAP: u64 = 16 << 20;

/// Free ranges kept while cutting out reservations.
const MAX_PIECES: usize = 32;

unsafe extern "C" {
    /// First byte of the kernel image (linker script).
    static __kernel_start: u8;
    /// First byte past the kernel image, `.bss` (stacks) included.
    static __kernel_end: u8;
}

/// A set of disjoint ranges.
struct Pieces {
    r: [Range; MAX_PIECES],
    n: usize,
}

impl Pieces {
    fn push(&mut self, base: u64, end: u64) -> Result<(), &'static str> {
        if end <= base {
            return Ok(());
        }
        if self.n == MAX_PIECES {
            return Err("too many memory ranges");
        }
        self.r[self.n] = Range { base, size: end - base };
        self.n += 1;
        Ok(())
    }

    /// Removes `[base, end)` from every range.
    fn cut(&mut self, base: u64, end: u64) -> Result<(), &'static str> {
        let old = Pieces { r: self.r, n: self.n };
        self.n = 0;
        for p in &old.r[..old.n] {
            let pe = p.base + p.size;
            if end <= p.base || base >= pe {
                self.push(p.base, pe)?;
            } else {
                self.push(p.base, base.max(p.base))?;
                self.push(end.min(pe), pe)?;
            }
        }
        Ok(())
    }
}

/// `ranges` (mapped part only) less the kernel image, the device tree
/// blob and its reservations.
fn free_ranges(dt: &DeviceTree, ranges: &[Range]) -> Result<Pieces, &'static str> {
    let page = PAGE_SIZE as u64;
    let kernel = (&raw const __kernel_start as u64, &raw const __kernel_end as u64);
    let blob = (dt.blob.base, dt.blob.base + dt.blob.size);
    let mut free = Pieces { r: [Range::default(); MAX_PIECES], n: 0 };
    for m in ranges {
        free.push(m.base, (m.base + m.size).min(MAPPED_LIMIT))?;
    }
    free.cut(kernel.0 / page * page, kernel.1.next_multiple_of(page))?;
    free.cut(blob.0 / page * page, blob.1.next_multiple_of(page))?;
    for r in &dt.reserved[..dt.reserved_count.min(MAX_RANGES)] {
        free.cut(r.base / page * page, (r.base + r.size).next_multiple_of(page))?;
    }
    Ok(free)
}

/// The NUMA boot: hands each `/memory` range, less the kernel, the blob
/// and the reservations, to `KMEM_NUMA` as memory of its node's
/// `numa-node-id`, but for [`NUMA_GLOBAL_HEAP`] bytes of node 0, which go
/// to `KMEM`.
pub fn give_ram_numa(dt: &DeviceTree) -> Result<(), &'static str> {
    let page = PAGE_SIZE as u64;
    let mut global = false;
    for (m, &node) in dt.memory[..dt.memory_count].iter().zip(&dt.memory_node) {
        kprintln!("memory: RAM {:#x}..{:#x} ({} MiB) on node {node}", m.base, m.base + m.size, m.size >> 20);
        let free = free_ranges(dt, core::slice::from_ref(m))?;
        for p in &free.r[..free.n] {
            let (start, mut end) = (p.base.next_multiple_of(page), (p.base + p.size) / page * page);
            if end <= start {
                continue;
            }
            if !global && node == 0 && end - start > 2 * NUMA_GLOBAL_HEAP {
                end -= NUMA_GLOBAL_HEAP;
                // SAFETY: as in `give_ram`: RAM outside the image, the blob
                // and its reservations, identity mapped, given to `KMEM`
                // alone.
                unsafe { KMEM.source().add_raw(end as *mut u8, NUMA_GLOBAL_HEAP as usize, 0) }
                    .map_err(|_| "kmemcg refused a memory range")?;
                kprintln!("memory: -> global heap {:#x}..{:#x}", end, end + NUMA_GLOBAL_HEAP);
                global = true;
            }
            // SAFETY: as above, for the rest of the piece, which only
            // `KMEM_NUMA` gets.
            unsafe { numa::give::<Aarch64>(start, end, node as usize) }?;
        }
    }
    if global { Ok(()) } else { Err("no room on node 0 for the global heap") }
}

/// Gives RAM to `KMEM` (and `SOLO_BYTES` of it to `SOLO`); with
/// `heap=KIB`, only that many bytes at the start of the largest free
/// range, to `KMEM`.
pub fn give_ram(dt: &DeviceTree) -> Result<(), &'static str> {
    let page = PAGE_SIZE as u64;
    let kernel = (&raw const __kernel_start as u64, &raw const __kernel_end as u64);
    let blob = (dt.blob.base, dt.blob.base + dt.blob.size);
    for m in &dt.memory[..dt.memory_count] {
        kprintln!("memory: RAM {:#x}..{:#x} ({} MiB)", m.base, m.base + m.size, m.size >> 20);
    }
    kprintln!("memory: kernel image {:#x}..{:#x}, device tree {:#x}..{:#x}", kernel.0, kernel.1, blob.0, blob.1);
    for r in &dt.reserved[..dt.reserved_count.min(MAX_RANGES)] {
        kprintln!("memory: reserved {:#x}..{:#x}", r.base, r.base + r.size);
    }
    let mut free = free_ranges(dt, &dt.memory[..dt.memory_count])?;

    let largest = (0..free.n).max_by_key(|&i| free.r[i].size).ok_or("no RAM in the device tree")?;
    if let Some(bytes) = dt.heap {
        // The heap suite: `bytes` at the start of the largest range (page
        // aligned), nothing else: a small kernel's heap.
        let r = free.r[largest];
        let start = r.base.next_multiple_of(page);
        if start + bytes as u64 > r.base + r.size {
            return Err("heap= asks for more RAM than the largest range has");
        }
        // SAFETY: as below: RAM outside the image, the blob and its
        // reservations, identity mapped, given to `KMEM` alone.
        unsafe { KMEM.source().add_raw(start as *mut u8, bytes, 0) }.map_err(|_| "kmemcg refused the heap= range")?;
        kprintln!("memory: -> kmemcg {:#x}..{:#x} ({} KiB), nothing else", start, start + bytes as u64, bytes >> 10);
        return Ok(());
    }
    if free.r[largest].size < 2 * SOLO_BYTES {
        return Err("not enough RAM");
    }
    free.r[largest].size -= SOLO_BYTES;
    let solo = free.r[largest].base + free.r[largest].size;

    let mut total = 0;
    for p in &free.r[..free.n] {
        let (start, end) = (p.base.next_multiple_of(page), (p.base + p.size) / page * page);
        if end <= start {
            continue;
        }
        // SAFETY: `[start, end)` is RAM the device tree reports, identity
        // mapped as normal memory, outside the kernel image (stacks, page
        // tables, statics), the device tree blob and its reservations, and
        // outside the range given to `SOLO`; nothing in this kernel touches
        // memory it did not get from a heap, and `KMEM` is a `static`.
        unsafe { KMEM.source().add_raw(start as *mut u8, (end - start) as usize, 0) }
            .map_err(|_| "kmemcg refused a memory range")?;
        kprintln!("memory: -> kmemcg {:#x}..{:#x} ({} KiB)", start, end, (end - start) >> 10);
        total += end - start;
    }
    // SAFETY: as above: RAM cut out of the free ranges for `SOLO` alone,
    // which is a `static`.
    unsafe { SOLO.source().add_raw(solo as *mut u8, SOLO_BYTES as usize, 0) }
        .map_err(|_| "kmemcg refused the comparison heap's range")?;
    kprintln!(
        "memory: heap {} MiB in {} free pages; NoCpus comparison heap {:#x}..{:#x}",
        total >> 20,
        KMEM.source().free_pages_on(0),
        solo,
        solo + SOLO_BYTES
    );
    Ok(())
}
