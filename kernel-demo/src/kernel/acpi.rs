//! Just enough ACPI to list the CPUs: the RSDP (in the EBDA or the BIOS
//! area), the RSDT, and the MADT's processor-local-APIC entries.

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

/// Lists the enabled processors from the MADT.
pub fn cpus() -> Result<Cpus, &'static str> {
    let rsdp = find_rsdp().ok_or("no ACPI RSDP found")?;
    let rsdt = word(rsdp + 16) as usize;
    if (0..4).any(|i| byte(rsdt + i) != b"RSDT"[i]) {
        return Err("the RSDP does not point at an RSDT");
    }
    let len = word(rsdt + 4) as usize;
    let madt = (rsdt + 36..rsdt + len)
        .step_by(4)
        .map(|e| word(e) as usize)
        .find(|&t| (0..4).all(|i| byte(t + i) == b"APIC"[i]))
        .ok_or("no MADT in the RSDT")?;
    let len = word(madt + 4) as usize;
    if !checksum_ok(madt, len) {
        return Err("the MADT's checksum is wrong");
    }
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
