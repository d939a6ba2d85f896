//! A minimal flattened device tree reader: RAM (`/memory`), the memory
//! reservation block, the CPUs' MPIDRs, the GIC, the generic timer's
//! virtual interrupt, the PL011, the PSCI conduit, and whether the kernel
//! command line (`/chosen` `bootargs`, QEMU's `-append`) asks for the
//! instruction counts only (`icount`), the heap suite in a small heap
//! (`heap=KIB`) or the two-node test (`numa`), with the `numa-node-id` of
//! each CPU and memory node.

use super::cpu::{Conduit, MAX_CPUS};

const FDT_MAGIC: u32 = 0xd00d_feed;
const FDT_BEGIN_NODE: u32 = 1;
const FDT_END_NODE: u32 = 2;
const FDT_PROP: u32 = 3;
const FDT_NOP: u32 = 4;
const FDT_END: u32 = 9;

/// Nesting the reader follows (QEMU's tree is 3 deep).
const MAX_DEPTH: usize = 16;
/// `/memory` ranges and reservations kept.
pub const MAX_RANGES: usize = 8;

/// A physical range `[base, base + size)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Range {
    /// First byte.
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
}

/// What the kernel takes from the device tree.
pub struct DeviceTree {
    /// Where the blob lies (to keep it out of the heap).
    pub blob: Range,
    /// `/memory` `reg` ranges (the first `memory_count`).
    pub memory: [Range; MAX_RANGES],
    pub memory_count: usize,
    /// `numa-node-id` of the `/memory` node each range came from (0 if
    /// none).
    pub memory_node: [u32; MAX_RANGES],
    /// The memory reservation block's entries.
    pub reserved: [Range; MAX_RANGES],
    pub reserved_count: usize,
    /// MPIDR of each CPU node, in tree order.
    pub cpus: [u64; MAX_CPUS],
    pub cpu_count: usize,
    /// `numa-node-id` of each CPU node (0 if none).
    pub cpu_node: [u32; MAX_CPUS],
    /// GICv2 distributor and CPU interface.
    pub gicd: Option<u64>,
    pub gicc: Option<u64>,
    /// INTID of the virtual timer (PPI number + 16).
    pub timer_intid: Option<u32>,
    /// The first PL011.
    pub uart: Option<u64>,
    /// `/psci` `method`.
    pub psci: Option<Conduit>,
    /// Whether `/chosen` `bootargs` has the word `icount`: measure
    /// instruction counts only (`icount.rs`), no self-test.
    pub icount: bool,
    /// `heap=KIB` in `bootargs`, in bytes: the heap gets only that much
    /// RAM and runs the tutorial heap suite only (`kernel_common::small_heap`).
    pub heap: Option<usize>,
    /// Whether `bootargs` has the word `numa`: the two-node test
    /// (`numa.rs`) instead of the self-test; with `icount` too, its
    /// instruction counts.
    pub numa: bool,
}

/// What a node is, as far as this reader cares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Other,
    Cpus,
    Cpu,
    Memory,
    Psci,
    Chosen,
    Gic,
    Timer,
    Uart,
}

/// One open node: the cells its children's `reg` use, and what it holds.
#[derive(Clone, Copy)]
struct Node<'a> {
    kind: Kind,
    address_cells: usize,
    size_cells: usize,
    reg: &'a [u8],
    interrupts: &'a [u8],
    method: &'a [u8],
    /// `numa-node-id` (0 if absent).
    numa_node: u32,
}

impl Node<'_> {
    const EMPTY: Node<'static> = Node {
        kind: Kind::Other,
        address_cells: 2,
        size_cells: 1,
        reg: &[],
        interrupts: &[],
        method: &[],
        numa_node: 0,
    };
}

fn be32(b: &[u8], at: usize) -> Result<u32, &'static str> {
    b.get(at..at + 4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]])).ok_or("device tree truncated")
}

fn be64(b: &[u8], at: usize) -> Result<u64, &'static str> {
    Ok((be32(b, at)? as u64) << 32 | be32(b, at + 4)? as u64)
}

/// The NUL-terminated string at `at`, without the NUL.
fn cstr(b: &[u8], at: usize) -> Result<&[u8], &'static str> {
    let rest = b.get(at..).ok_or("device tree truncated")?;
    let len = rest.iter().position(|&c| c == 0).ok_or("unterminated device tree string")?;
    Ok(&rest[..len])
}

/// A number of `cells` 32-bit cells at `at` (1 or 2).
fn cells(b: &[u8], at: usize, cells: usize) -> Result<u64, &'static str> {
    match cells {
        1 => Ok(be32(b, at)? as u64),
        2 => be64(b, at),
        _ => Err("unsupported #address-cells or #size-cells"),
    }
}

/// Whether the string list `list` holds `s`.
fn has_string(list: &[u8], s: &[u8]) -> bool {
    list.split(|&c| c == 0).any(|x| x == s)
}

impl DeviceTree {
    /// Reads the flattened device tree at `addr`.
    ///
    /// # Safety
    ///
    /// `addr` must be the address of a device tree blob the loader left
    /// in mapped memory, intact.
    pub unsafe fn read(addr: usize) -> Result<DeviceTree, &'static str> {
        if addr == 0 || !addr.is_multiple_of(8) {
            return Err("no device tree address in x0");
        }
        // SAFETY: the caller vouches for the header (40 bytes).
        let header = unsafe { core::slice::from_raw_parts(addr as *const u8, 40) };
        if be32(header, 0)? != FDT_MAGIC {
            return Err("no device tree magic at the address in x0");
        }
        let total = be32(header, 4)? as usize;
        // SAFETY: the header says the blob is `total` bytes long.
        let blob = unsafe { core::slice::from_raw_parts(addr as *const u8, total) };
        let (structs, strings, rsvmap) =
            (be32(header, 8)? as usize, be32(header, 12)? as usize, be32(header, 16)? as usize);
        let mut dt = DeviceTree {
            blob: Range { base: addr as u64, size: total as u64 },
            memory: [Range::default(); MAX_RANGES],
            memory_count: 0,
            memory_node: [0; MAX_RANGES],
            reserved: [Range::default(); MAX_RANGES],
            reserved_count: 0,
            cpus: [0; MAX_CPUS],
            cpu_count: 0,
            cpu_node: [0; MAX_CPUS],
            gicd: None,
            gicc: None,
            timer_intid: None,
            uart: None,
            psci: None,
            icount: false,
            heap: None,
            numa: false,
        };

        let mut p = rsvmap;
        loop {
            let r = Range { base: be64(blob, p)?, size: be64(blob, p + 8)? };
            p += 16;
            if r.base == 0 && r.size == 0 {
                break;
            }
            if dt.reserved_count < MAX_RANGES {
                dt.reserved[dt.reserved_count] = r;
                dt.reserved_count += 1;
            }
        }

        let mut stack = [Node::EMPTY; MAX_DEPTH];
        let mut depth = 0usize; // stack[depth] is the innermost open node
        let mut p = structs;
        loop {
            let token = be32(blob, p)?;
            p += 4;
            match token {
                FDT_BEGIN_NODE => {
                    let name = cstr(blob, p)?;
                    p = (p + name.len() + 1).next_multiple_of(4);
                    if depth + 1 >= MAX_DEPTH {
                        return Err("device tree nested too deeply");
                    }
                    let parent = stack[depth].kind;
                    let base = name.split(|&c| c == b'@').next().unwrap_or(name);
                    let kind = match (depth, base) {
                        (1, b"memory") => Kind::Memory,
                        (1, b"cpus") => Kind::Cpus,
                        (1, b"psci") => Kind::Psci,
                        (1, b"chosen") => Kind::Chosen,
                        (2, b"cpu") if parent == Kind::Cpus => Kind::Cpu,
                        _ => Kind::Other,
                    };
                    depth += 1;
                    stack[depth] = Node { kind, ..Node::EMPTY };
                }
                FDT_END_NODE => {
                    if depth == 0 {
                        return Err("unbalanced device tree");
                    }
                    dt.close(&stack[depth], &stack[depth - 1])?;
                    depth -= 1;
                }
                FDT_PROP => {
                    let len = be32(blob, p)? as usize;
                    let name = cstr(blob, strings + be32(blob, p + 4)? as usize)?;
                    let value = blob.get(p + 8..p + 8 + len).ok_or("device tree truncated")?;
                    p = (p + 8 + len).next_multiple_of(4);
                    let node = &mut stack[depth];
                    match name {
                        b"#address-cells" => node.address_cells = be32(value, 0)? as usize,
                        b"#size-cells" => node.size_cells = be32(value, 0)? as usize,
                        b"reg" => node.reg = value,
                        b"interrupts" => node.interrupts = value,
                        b"method" => node.method = value,
                        b"numa-node-id" => node.numa_node = be32(value, 0)?,
                        b"bootargs" if node.kind == Kind::Chosen => {
                            let args = cstr(value, 0)?;
                            dt.icount = args.split(|&c| c == b' ').any(|w| w == b"icount");
                            dt.heap = kernel_common::tutorial_heap::heap_arg(args);
                            dt.numa = args.split(|&c| c == b' ').any(|w| w == b"numa");
                        }
                        b"device_type" if depth == 1 && has_string(value, b"memory") => node.kind = Kind::Memory,
                        b"compatible" => {
                            if has_string(value, b"arm,cortex-a15-gic") || has_string(value, b"arm,gic-400") {
                                node.kind = Kind::Gic;
                            } else if has_string(value, b"arm,armv8-timer") || has_string(value, b"arm,armv7-timer") {
                                node.kind = Kind::Timer;
                            } else if has_string(value, b"arm,pl011") {
                                node.kind = Kind::Uart;
                            }
                        }
                        _ => {}
                    }
                }
                FDT_NOP => {}
                FDT_END => break,
                _ => return Err("bad device tree token"),
            }
        }
        Ok(dt)
    }

    /// Records what a node that just closed says; `parent` gives the
    /// cells of its `reg`.
    fn close(&mut self, node: &Node<'_>, parent: &Node<'_>) -> Result<(), &'static str> {
        let (ac, sc) = (parent.address_cells, parent.size_cells);
        let entry = (ac + sc) * 4;
        let reg = |i: usize| -> Result<Range, &'static str> {
            let at = i * entry;
            let size = if sc == 0 { 0 } else { cells(node.reg, at + ac * 4, sc)? };
            Ok(Range { base: cells(node.reg, at, ac)?, size })
        };
        match node.kind {
            Kind::Memory if entry > 0 => {
                for i in 0..node.reg.len() / entry {
                    if self.memory_count < MAX_RANGES {
                        self.memory[self.memory_count] = reg(i)?;
                        self.memory_node[self.memory_count] = node.numa_node;
                        self.memory_count += 1;
                    }
                }
            }
            Kind::Cpu if !node.reg.is_empty() && self.cpu_count < MAX_CPUS => {
                self.cpus[self.cpu_count] = reg(0)?.base;
                self.cpu_node[self.cpu_count] = node.numa_node;
                self.cpu_count += 1;
            }
            Kind::Gic => {
                self.gicd = Some(reg(0)?.base);
                self.gicc = Some(reg(1)?.base);
            }
            // Entries of <type number flags>: secure physical, non-secure
            // physical, virtual, hypervisor. Type 1: PPI.
            Kind::Timer if be32(node.interrupts, 24)? == 1 => {
                self.timer_intid = Some(be32(node.interrupts, 28)? + 16);
            }
            Kind::Uart if self.uart.is_none() => self.uart = Some(reg(0)?.base),
            Kind::Psci => {
                let m = cstr(node.method, 0).unwrap_or(b"");
                self.psci = match m {
                    b"hvc" => Some(Conduit::Hvc),
                    b"smc" => Some(Conduit::Smc),
                    _ => None,
                };
            }
            _ => {}
        }
        Ok(())
    }
}
