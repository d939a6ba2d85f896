//! Just enough ACPI to list the CPUs and, for the NUMA boot, their nodes:
//! the RSDP (in the EBDA or the BIOS area), the RSDT, the MADT's
//! processor-local-APIC entries, and the SRAT's processor and memory
//! affinity entries.

use core::ptr::read_unaligned;

use super::cpu::MAX_SMP;

/// The APIC IDs of the enabled processors, in MADT order.
pub struct Cpus {
    pub ids: [u32; MAX_SMP],
    pub count: usize,
    /// Enabled processors the MADT lists beyond `MAX_SMP`.
    pub ignored: usize,
}

fn byte(addr: usize) -> u8 {
    // SAFETY: callers read inside the first MiB or inside ACPI tables
    // whose lengths they checked; the boot stub identity-maps 4 GiB and
    // the firmware's tables lie below it.
    unsafe { read_unaligned(addr as *const u8) }
}

fn word(addr: usize) -> u32 {
    u32::from_le_bytes([byte(addr), byte(addr + 1), byte(addr + 2), byte(addr + 3)])
}

fn checksum_ok(addr: usize, len: usize) -> bool {
    (addr..addr + len).fold(0u8, |s, a| s.wrapping_add(byte(a))) == 0
}

/// The RSDP's address: 16-byte aligned, in the first KiB of the EBDA or
/// in 0xE0000..0x100000.
fn find_rsdp() -> Option<usize> {
    let ebda = usize::from(u16::from_le_bytes([byte(0x40E), byte(0x40F)])) << 4;
    let ranges = [(ebda, ebda + 1024), (0xE0000, 0x100000)];
    ranges.into_iter().filter(|&(start, _)| start != 0).find_map(|(start, end)| {
        (start..end).step_by(16).find(|&a| (0..8).all(|i| byte(a + i) == b"RSD PTR "[i]) && checksum_ok(a, 20))
    })
}

/// The table with signature `sig` in the RSDT, and its length, checksum
/// checked; `None` if the RSDT lists none.
fn find_table(sig: &[u8; 4]) -> Result<Option<(usize, usize)>, &'static str> {
    let rsdp = find_rsdp().ok_or("no ACPI RSDP found")?;
    let rsdt = word(rsdp + 16) as usize;
    if (0..4).any(|i| byte(rsdt + i) != b"RSDT"[i]) {
        return Err("the RSDP does not point at an RSDT");
    }
    let len = word(rsdt + 4) as usize;
    let Some(table) =
        (rsdt + 36..rsdt + len).step_by(4).map(|e| word(e) as usize).find(|&t| (0..4).all(|i| byte(t + i) == sig[i]))
    else {
        return Ok(None);
    };
    let len = word(table + 4) as usize;
    if !checksum_ok(table, len) {
        return Err("an ACPI table's checksum is wrong");
    }
    Ok(Some((table, len)))
}

/// Lists the enabled processors from the MADT.
pub fn cpus() -> Result<Cpus, &'static str> {
    let (madt, len) = find_table(b"APIC")?.ok_or("no MADT in the RSDT")?;
    let mut cpus = Cpus { ids: [0; MAX_SMP], count: 0, ignored: 0 };
    let mut e = madt + 44;
    while e + 2 <= madt + len {
        let (kind, elen) = (byte(e), usize::from(byte(e + 1)));
        if elen < 2 {
            return Err("a MADT entry has length < 2");
        }
        // Type 0: processor local APIC: ACPI id, APIC id, flags (bit 0:
        // enabled).
        if kind == 0 && elen >= 8 && word(e + 4) & 1 != 0 {
            if cpus.count < MAX_SMP {
                cpus.ids[cpus.count] = u32::from(byte(e + 3));
                cpus.count += 1;
            } else {
                cpus.ignored += 1;
            }
        }
        e += elen;
    }
    if cpus.count == 0 {
        return Err("the MADT lists no enabled processor");
    }
    Ok(cpus)
}

/// Memory affinity ranges kept from the SRAT (QEMU lists a few per node).
const MAX_MEMS: usize = 16;

/// A memory range and its proximity domain.
#[derive(Clone, Copy, Default)]
pub struct MemAffinity {
    pub base: u64,
    pub len: u64,
    pub domain: u32,
}

/// What the SRAT (System Resource Affinity Table) says: the proximity
/// domain of each enabled processor (by APIC ID) and memory range.
pub struct Srat {
    cpus: [(u32, u32); MAX_SMP],
    ncpus: usize,
    pub mems: [MemAffinity; MAX_MEMS],
    pub nmems: usize,
}

impl Srat {
    /// The node of the processor with APIC ID `apic_id`.
    pub fn node_of_apic(&self, apic_id: u32) -> Option<usize> {
        self.cpus[..self.ncpus].iter().find(|c| c.0 == apic_id).map(|c| self.node_of_domain(c.1))
    }

    /// The node of proximity domain `domain`: domains need not be dense
    /// (ACPI only asks that they differ), so the node is the domain's rank
    /// among those the SRAT names.
    pub fn node_of_domain(&self, domain: u32) -> usize {
        let domains =
            || self.cpus[..self.ncpus].iter().map(|c| c.1).chain(self.mems[..self.nmems].iter().map(|m| m.domain));
        // The distinct domains below `domain`, each counted at its first
        // appearance.
        domains().enumerate().filter(|&(i, d)| d < domain && !domains().take(i).any(|e| e == d)).count()
    }
}

/// Reads the SRAT: entries start after its 36-byte header and 12
/// reserved bytes. Type 0 (processor local APIC affinity, 16 bytes):
/// domain bits 7:0 at 2, APIC ID at 3, flags at 4 (bit 0: enabled),
/// domain bits 31:8 at 9..12. Type 1 (memory affinity, 40 bytes): domain
/// at 2, base at 8, length at 16, flags at 28 (bit 0: enabled). Type 2
/// (x2APIC affinity, 24 bytes): domain at 4, x2APIC ID at 8, flags at 12.
pub fn srat() -> Result<Srat, &'static str> {
    let (srat, len) = find_table(b"SRAT")?.ok_or("no SRAT in the RSDT (boot QEMU with -numa)")?;
    let mut out = Srat { cpus: [(0, 0); MAX_SMP], ncpus: 0, mems: [MemAffinity::default(); MAX_MEMS], nmems: 0 };
    let mut e = srat + 48;
    while e + 2 <= srat + len {
        let (kind, elen) = (byte(e), usize::from(byte(e + 1)));
        if elen < 2 || e + elen > srat + len {
            return Err("a SRAT entry has a bad length");
        }
        let cpu = match kind {
            0 if elen >= 16 && word(e + 4) & 1 != 0 => {
                let high = word(e + 8) >> 8; // bytes 9..12, bits 31:8
                Some((u32::from(byte(e + 3)), (high << 8) | u32::from(byte(e + 2))))
            }
            2 if elen >= 24 && word(e + 12) & 1 != 0 => Some((word(e + 8), word(e + 4))),
            1 if elen >= 40 && word(e + 28) & 1 != 0 => {
                let q = |at: usize| u64::from(word(at)) | (u64::from(word(at + 4)) << 32);
                if out.nmems == MAX_MEMS {
                    return Err("the SRAT lists too many memory ranges");
                }
                out.mems[out.nmems] = MemAffinity { base: q(e + 8), len: q(e + 16), domain: word(e + 2) };
                out.nmems += 1;
                None
            }
            _ => None,
        };
        if let Some(c) = cpu
            && out.ncpus < MAX_SMP
        {
            out.cpus[out.ncpus] = c;
            out.ncpus += 1;
        }
        e += elen;
    }
    if out.ncpus == 0 || out.nmems == 0 {
        return Err("the SRAT lists no processor or no memory");
    }
    Ok(out)
}
