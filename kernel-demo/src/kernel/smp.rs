//! Starting the application processors, and the phases every CPU steps
//! through together.
//!
//! # Bring-up
//!
//! The trampoline below is copied to [`TRAMPOLINE`] (0x8000, below 1 MiB,
//! never handed to the allocator). For each AP the BSP writes the
//! trampoline's parameters (CR3, stack top, CPU index, entry point), sends
//! INIT, waits 10 ms, sends STARTUP twice (vector 0x08: real mode at
//! 0800:0000, 200 µs apart; a CPU already running ignores the second) and
//! waits for the AP to mark itself online before starting the next, so
//! one parameter block serves all. The AP climbs from real mode to
//! protected mode (with the trampoline's own GDT, whose selectors match
//! the boot GDT's), turns on PAE, loads the BSP's page tables, sets
//! `EFER.LME`, turns on paging, far-jumps into 64-bit code, switches to
//! its stack and calls the entry point (`kernel::ap_main`).
//!
//! # Phases
//!
//! The BSP moves [`PHASE`] forward and every CPU reports arrival at the
//! end of a phase; waiters halt until the wake IPI that every change
//! broadcasts (or a timer tick) and check again.

use core::arch::{asm, global_asm};
use core::ptr::write_volatile;
use core::sync::atomic::{AtomicUsize, Ordering, fence};

use super::acpi::Cpus;
use super::cpu::{self, MAX_SMP, wait_until};
use super::serial::kprintln;
use super::{apic, idt, time};

/// Physical address of the trampoline page.
const TRAMPOLINE: usize = 0x8000;
/// Bytes of stack per AP.
const AP_STACK: usize = 64 * 1024;

global_asm!(
    ".pushsection .rodata.ap_trampoline, \"a\"",
    ".balign 16",
    ".global ap_trampoline_start",
    "ap_trampoline_start:",
    ".code16",
    "    cli",
    "    cld",
    "    movw %cs, %ax",
    "    movw %ax, %ds",
    "    lgdtl ap_gdt_ptr - ap_trampoline_start",
    "    movl %cr0, %eax",
    "    orl $1, %eax",
    "    movl %eax, %cr0",
    "    ljmpl $0x18, ${tramp} + ap_pm - ap_trampoline_start",
    ".code32",
    "ap_pm:",
    "    movw $0x10, %ax",
    "    movw %ax, %ds",
    "    movw %ax, %es",
    "    movw %ax, %ss",
    "    movl %cr4, %eax",
    "    orl $(1 << 5), %eax",
    "    movl %eax, %cr4",
    "    movl {tramp} + ap_trampoline_params - ap_trampoline_start, %eax",
    "    movl %eax, %cr3",
    "    movl $0xC0000080, %ecx",
    "    rdmsr",
    "    orl $(1 << 8), %eax",
    "    wrmsr",
    "    movl %cr0, %eax",
    "    orl $0x80000001, %eax",
    "    movl %eax, %cr0",
    "    ljmpl $0x08, ${tramp} + ap_lm - ap_trampoline_start",
    ".code64",
    "ap_lm:",
    "    movw $0x10, %ax",
    "    movw %ax, %ds",
    "    movw %ax, %es",
    "    movw %ax, %ss",
    "    movq {tramp} + ap_trampoline_params - ap_trampoline_start + 8, %rsp",
    "    movq {tramp} + ap_trampoline_params - ap_trampoline_start + 16, %rdi",
    "    movq {tramp} + ap_trampoline_params - ap_trampoline_start + 24, %rax",
    "    xorl %ebp, %ebp",
    "    callq *%rax",
    "1:",
    "    cli",
    "    hlt",
    "    jmp 1b",
    // Null, 64-bit code (0x08), data (0x10), 32-bit code (0x18).
    ".balign 8",
    "ap_gdt:",
    "    .quad 0",
    "    .quad 0x00AF9A000000FFFF",
    "    .quad 0x00CF92000000FFFF",
    "    .quad 0x00CF9A000000FFFF",
    "ap_gdt_ptr:",
    "    .word ap_gdt_ptr - ap_gdt - 1",
    "    .long {tramp} + ap_gdt - ap_trampoline_start",
    // Parameters: CR3, stack top, CPU index, entry point.
    ".balign 8",
    ".global ap_trampoline_params",
    "ap_trampoline_params:",
    "    .quad 0, 0, 0, 0",
    ".global ap_trampoline_end",
    "ap_trampoline_end:",
    ".popsection",
    tramp = const TRAMPOLINE,
    options(att_syntax),
);

unsafe extern "C" {
    static ap_trampoline_start: u8;
    static ap_trampoline_params: u8;
    static ap_trampoline_end: u8;
}

/// The APs' stacks (slot 0, the BSP's index, unused).
#[repr(C, align(16))]
struct Stacks([[u8; AP_STACK]; MAX_SMP]);

static mut AP_STACKS: Stacks = Stacks([[0; AP_STACK]; MAX_SMP]);

/// Copies the trampoline to its page; returns the parameters' address.
fn install_trampoline() -> Result<*mut u64, &'static str> {
    let start = &raw const ap_trampoline_start;
    let len = &raw const ap_trampoline_end as usize - start as usize;
    let params = &raw const ap_trampoline_params as usize - start as usize;
    if len > 4096 {
        return Err("the AP trampoline is larger than a page");
    }
    let page = TRAMPOLINE as *mut u8;
    // SAFETY: the trampoline's bytes are in the kernel image; the page at
    // 0x8000 is usable RAM below the kernel that nothing else uses (the
    // allocator only gets memory above the kernel), identity mapped.
    unsafe { core::ptr::copy_nonoverlapping(start, page, len) };
    Ok(page.wrapping_add(params).cast())
}

/// Starts every processor `cpus` lists but the BSP (APIC ID `bsp`); each
/// calls `entry` with the next index. Returns the CPUs online, BSP
/// included.
pub fn start_aps(cpus: &Cpus, bsp: u32, entry: extern "C" fn(usize) -> !) -> Result<usize, &'static str> {
    let params = install_trampoline()?;
    let cr3: u64;
    // SAFETY: reading CR3: the BSP's page tables, which the APs share.
    unsafe { asm!("mov {}, cr3", out(reg) cr3, options(nomem, nostack, preserves_flags)) };
    if cr3 >> 32 != 0 {
        return Err("the page tables lie above 4 GiB (the trampoline loads CR3 in 32-bit mode)");
    }
    let mut next = 1;
    for &id in &cpus.ids[..cpus.count] {
        if id == bsp {
            continue;
        }
        let index = next;
        let stack_top = &raw mut AP_STACKS as usize + (index + 1) * AP_STACK;
        // SAFETY: `params` points at the trampoline's four parameter
        // words; no AP runs the trampoline now (the previous one is online
        // and past it).
        unsafe {
            write_volatile(params, cr3);
            write_volatile(params.add(1), stack_top as u64);
            write_volatile(params.add(2), index as u64);
            write_volatile(params.add(3), entry as usize as u64);
        }
        fence(Ordering::SeqCst);
        apic::send_init(id);
        time::delay_us(10_000);
        apic::send_startup(id, (TRAMPOLINE >> 12) as u8);
        time::delay_us(200);
        apic::send_startup(id, (TRAMPOLINE >> 12) as u8);
        let block = cpu::get(index).ok_or("CPU index out of range")?;
        let deadline = time::rdtsc() + time::us_to_tsc(2_000_000);
        while !block.online.load(Ordering::Acquire) {
            if time::rdtsc() > deadline {
                kprintln!("smp: APIC ID {id} did not come up within 2 s");
                return Err("an application processor did not start");
            }
            core::hint::spin_loop();
        }
        kprintln!("smp: cpu index {index} (APIC ID {id}) online");
        next += 1;
    }
    Ok(next)
}

/// Where an AP arrives from the trampoline, on its own stack: per-CPU
/// block, IDT, local APIC, then online; then `run`.
pub fn ap_init(index: usize) -> Result<(), &'static str> {
    // SAFETY: first thing on this AP, with the index the BSP gave it
    // alone; nothing has read per-CPU state here yet.
    unsafe { cpu::set_this_cpu(index, apic::id()) };
    idt::load();
    apic::init()?;
    cpu::this().online.store(true, Ordering::Release);
    Ok(())
}

/// Phases of the SMP run.
pub mod phase {
    /// The workload, interrupts on.
    pub const WORK: usize = 1;
    /// The four-CPU benchmark.
    pub const BENCH: usize = 2;
    /// Done: halt.
    pub const END: usize = 3;
}

/// The current phase; only the BSP advances it.
static PHASE: AtomicUsize = AtomicUsize::new(0);
/// CPUs that finished each phase.
static ARRIVED: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// Starts phase `p` (BSP).
pub fn set_phase(p: usize) {
    PHASE.store(p, Ordering::Release);
    apic::wake_others();
}

/// Waits for phase `p` to start.
pub fn wait_phase(p: usize) {
    wait_until(|| PHASE.load(Ordering::Acquire) >= p);
}

/// Reports this CPU done with phase `p`.
pub fn arrive(p: usize) {
    ARRIVED[p].fetch_add(1, Ordering::AcqRel);
    apic::wake_others();
}

/// Waits until `n` CPUs are done with phase `p`.
pub fn wait_arrivals(p: usize, n: usize) {
    wait_until(|| ARRIVED[p].load(Ordering::Acquire) >= n);
}
