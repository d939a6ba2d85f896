//! The multiboot memory map, and handing usable RAM to the allocator.

use core::ptr::read_unaligned;

use kmemcg::PAGE_SIZE;

use super::acpi::Srat;
use super::serial::kprintln;
use kernel_common::numa;

use super::arch::X86_64;
use super::{KMEM, KMEM_NOCPUS};

/// The boot stub identity-maps `[0, IDENTITY_LIMIT)`; memory above it is
/// not addressable.
const IDENTITY_LIMIT: u64 = 4 << 30;

/// Memory map entries kept (QEMU reports about six).
const MAX_ENTRIES: usize = 32;

/// Memory map entry type of usable RAM.
const USABLE: u32 = 1;

/// Bytes kept from the top of the largest usable range for the `NoCpus`
/// allocator of the benchmark.
const BENCH_HEAP: u64 = 4 << 20;

/// In the NUMA boot, bytes of node 0's first range for the global heap
/// (the kernel's own allocations); the rest goes to `KMEM_NUMA`.
const NUMA_GLOBAL_HEAP: u64 = 16 << 20;

unsafe extern "C" {
    /// First byte of the kernel image (linker script).
    static __kernel_start: u8;
    /// First byte past the kernel image, `.bss` (stack, page tables) included.
    static __kernel_end: u8;
}

/// One memory map entry.
#[derive(Clone, Copy, Default)]
struct Entry {
    base: u64,
    len: u64,
    kind: u32,
}

/// What the kernel needs from the multiboot information, copied out of it.
pub struct BootInfo {
    entries: [Entry; MAX_ENTRIES],
    count: usize,
    /// End of the kernel image and of every boot structure above it that
    /// must survive (modules), or that is read below (the map itself).
    reserved_end: u64,
    /// Whether the command line has the word `icount`: measure instruction
    /// counts only (`icount.rs`), no self-test.
    pub icount: bool,
    /// `heap=KIB` on the command line, in bytes: the heap gets only that
    /// much RAM and runs the tutorial heap suite only (`kernel_common::small_heap`).
    pub heap: Option<usize>,
    /// Whether the command line has the word `numa`: the two-node test
    /// (`numa.rs`) instead of the self-test; with `icount` too, its
    /// instruction counts.
    pub numa: bool,
}

/// Length of the NUL-terminated string at `p`.
///
/// # Safety
///
/// `p` must point to a NUL-terminated string in mapped memory.
unsafe fn strlen(p: usize) -> u64 {
    // SAFETY: forwarded from the caller.
    unsafe { core::ffi::CStr::from_ptr(p as *const core::ffi::c_char) }.count_bytes() as u64 + 1
}

impl BootInfo {
    /// Reads the multiboot v1 information at `info`.
    ///
    /// # Safety
    ///
    /// `info` must be the address a multiboot loader passed in `ebx`, with
    /// everything it points to still intact and identity mapped.
    pub unsafe fn read(info: usize) -> Result<BootInfo, &'static str> {
        // SAFETY: the caller vouches for the 88-byte multiboot structure at
        // `info`; every offset used is inside it, fields are used only when
        // `flags` says they are valid, and unaligned reads fit any layout.
        let word = |off: usize| unsafe { read_unaligned((info + off) as *const u32) } as usize;
        let flags = word(0);
        if flags & (1 << 6) == 0 {
            return Err("the loader gave no memory map (multiboot flags bit 6)");
        }
        let mut reserved_end = &raw const __kernel_end as u64;
        let mut reserve = |start: u64, len: u64| reserved_end = reserved_end.max(start + len);
        reserve(info as u64, 88); // the information structure itself
        let mut icount = false;
        let mut heap = None;
        let mut numa = false;
        if flags & (1 << 2) != 0 {
            // SAFETY: bit 2: `cmdline` is a valid C string.
            let cmdline = unsafe { core::ffi::CStr::from_ptr(word(16) as *const core::ffi::c_char) };
            reserve(word(16) as u64, cmdline.count_bytes() as u64 + 1);
            // QEMU passes the kernel's file name, a space, then `-append`.
            icount = cmdline.to_bytes().split(|&c| c == b' ').any(|w| w == b"icount");
            numa = cmdline.to_bytes().split(|&c| c == b' ').any(|w| w == b"numa");
            heap = kernel_common::tutorial_heap::heap_arg(cmdline.to_bytes());
        }
        if flags & (1 << 3) != 0 {
            let (count, addr) = (word(20), word(24));
            reserve(addr as u64, count as u64 * 16);
            for m in 0..count {
                // SAFETY: bit 3: `count` module entries of 16 bytes at `addr`,
                // each starting with `mod_start` and `mod_end`.
                let (start, end) = unsafe {
                    (read_unaligned((addr + m * 16) as *const u32), read_unaligned((addr + m * 16 + 4) as *const u32))
                };
                reserve(start as u64, end.saturating_sub(start) as u64);
            }
        }
        if flags & (1 << 9) != 0 {
            // SAFETY: bit 9: `boot_loader_name` is a valid C string.
            reserve(word(64) as u64, unsafe { strlen(word(64)) });
        }
        let (len, addr) = (word(44), word(48));
        reserve(addr as u64, len as u64);

        let mut boot =
            BootInfo { entries: [Entry::default(); MAX_ENTRIES], count: 0, reserved_end, icount, heap, numa };
        let mut p = addr;
        while p + 24 <= addr + len && boot.count < MAX_ENTRIES {
            // SAFETY: bit 6: `len` bytes of entries at `addr`, each
            // `size: u32` then `size` bytes of base, length and type.
            let (size, base, length, kind) = unsafe {
                (
                    read_unaligned(p as *const u32),
                    read_unaligned((p + 4) as *const u64),
                    read_unaligned((p + 12) as *const u64),
                    read_unaligned((p + 20) as *const u32),
                )
            };
            boot.entries[boot.count] = Entry { base, len: length, kind };
            boot.count += 1;
            p += size as usize + 4;
        }
        Ok(boot)
    }

    /// The usable part of entry `e`: above the kernel and boot structures,
    /// below the identity-mapping limit, page aligned.
    fn usable(&self, e: &Entry) -> Option<(u64, u64)> {
        let page = PAGE_SIZE as u64;
        let floor = self.reserved_end.next_multiple_of(page);
        let start = e.base.max(floor).next_multiple_of(page);
        let end = (e.base + e.len).min(IDENTITY_LIMIT) / page * page;
        (e.kind == USABLE && start < end).then_some((start, end))
    }

    /// The NUMA boot: hands each usable range, split where the SRAT's
    /// memory ranges split it, to `KMEM_NUMA` as memory of the range's
    /// node (`Srat::node_of_domain`), but for the first
    /// [`NUMA_GLOBAL_HEAP`] bytes of node 0, which go to `KMEM`.
    pub fn give_ram_numa(&self, srat: &Srat) -> Result<(), &'static str> {
        let page = PAGE_SIZE as u64;
        let mut global = false;
        for e in &self.entries[..self.count] {
            kprintln!("  mmap {:#013x}..{:#013x} type {}", e.base, e.base + e.len, e.kind);
            let Some((start, end)) = self.usable(e) else { continue };
            for m in &srat.mems[..srat.nmems] {
                let s = start.max(m.base).next_multiple_of(page);
                let mut t = end.min(m.base + m.len) / page * page;
                if s >= t {
                    continue;
                }
                let node = srat.node_of_domain(m.domain);
                if !global && node == 0 && t - s > 2 * NUMA_GLOBAL_HEAP {
                    t -= NUMA_GLOBAL_HEAP;
                    // SAFETY: as in `give_ram_to_kmem`: usable RAM above
                    // the kernel and boot structures, identity mapped,
                    // given to `KMEM` alone.
                    unsafe { KMEM.source().add_raw(t as *mut u8, NUMA_GLOBAL_HEAP as usize, 0) }
                        .map_err(|_| "kmemcg refused a memory range")?;
                    kprintln!("    -> global heap: {:#x}..{:#x}", t, t + NUMA_GLOBAL_HEAP);
                    global = true;
                }
                // SAFETY: as above, for the rest of the piece, which only
                // `KMEM_NUMA` gets.
                unsafe { numa::give::<X86_64>(s, t, node) }?;
            }
        }
        if global { Ok(()) } else { Err("no room on node 0 for the global heap") }
    }

    /// Prints the memory map and hands every usable range above the kernel
    /// and boot structures, and below the identity-mapping limit, to
    /// `KMEM`, but for the top [`BENCH_HEAP`] bytes of the largest, which
    /// go to `KMEM_NOCPUS`; with `heap=KIB`, only that many bytes at the
    /// start of the largest range, to `KMEM`. Returns the bytes `KMEM` got.
    pub fn give_ram_to_kmem(&self) -> Result<u64, &'static str> {
        let kernel = (&raw const __kernel_start as usize, &raw const __kernel_end as usize);
        kprintln!("kernel image {:#x}..{:#x}, boot data up to {:#x}", kernel.0, kernel.1, self.reserved_end);
        let usable = |e: &Entry| self.usable(e);
        let largest = self.entries[..self.count].iter().filter_map(usable).max_by_key(|&(s, e)| e - s);
        if let Some(bytes) = self.heap {
            // The heap suite: `bytes` at the start of the largest range,
            // nothing else (a small kernel's heap, mapped page aligned).
            let (start, end) = largest.ok_or("no usable RAM above the kernel")?;
            if bytes as u64 > end - start {
                return Err("heap= asks for more RAM than the largest range has");
            }
            // SAFETY: as below: usable RAM above the kernel and the boot
            // structures, identity mapped, given to `KMEM` alone.
            unsafe { KMEM.source().add_raw(start as *mut u8, bytes, 0) }
                .map_err(|_| "kmemcg refused the heap= range")?;
            kprintln!("    -> kmemcg: {:#x}..{:#x} ({} KiB), nothing else", start, start + bytes as u64, bytes >> 10);
            return Ok(bytes as u64);
        }
        let mut total = 0;
        for e in &self.entries[..self.count] {
            kprintln!("  mmap {:#013x}..{:#013x} type {}", e.base, e.base + e.len, e.kind);
            let Some((start, mut end)) = usable(e) else { continue };
            if Some((start, end)) == largest && end - start > 2 * BENCH_HEAP {
                end -= BENCH_HEAP;
                // SAFETY: as below, for the top of this range, which
                // `KMEM` does not get.
                unsafe { KMEM_NOCPUS.source().add_raw(end as *mut u8, BENCH_HEAP as usize, 0) }
                    .map_err(|_| "kmemcg refused a memory range")?;
                kprintln!("    -> bench heap (NoCpus): {:#x}..{:#x}", end, end + BENCH_HEAP);
            }
            // SAFETY: the loader reports `[start, end)` as usable RAM; it
            // lies above the kernel image and every boot structure still in
            // use, below the identity-mapping limit, and nothing else in
            // this kernel touches memory it did not get from an allocator,
            // and each range goes to one allocator, which lives for the rest
            // of the program.
            unsafe { KMEM.source().add_raw(start as *mut u8, (end - start) as usize, 0) }
                .map_err(|_| "kmemcg refused a memory range")?;
            kprintln!("    -> kmemcg: {:#x}..{:#x} ({} KiB)", start, end, (end - start) >> 10);
            total += end - start;
        }
        if total == 0 {
            return Err("no usable RAM above the kernel");
        }
        Ok(total)
    }
}
