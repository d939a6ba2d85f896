//! The image header, the entry points of the boot CPU and the secondary
//! CPUs, the MMU setup every CPU runs, and the exception vectors.
//!
//! QEMU's `-kernel` loader treats a file with the arm64 `Image` header as
//! a Linux kernel: it loads it at RAM base + `text_offset`, places the
//! device tree in RAM, and starts the boot CPU at the image's first byte
//! with `x0` = the device tree's address, at EL1 (or EL2 with
//! `virtualization=on`), MMU off. The other CPUs stay off until PSCI
//! `CPU_ON` starts them at `secondary_entry` with `x0` = their index.
//!
//! Every CPU: masks interrupts, drops from EL2 to EL1 if it runs at EL2,
//! enables FP/SIMD at EL1 (the target's code uses NEON registers), loads
//! `MAIR_EL1`, `TCR_EL1`, `TTBR0_EL1` (one level-1 table of 1 GiB blocks:
//! device memory below 1 GiB, normal write-back inner-shareable memory
//! from 1 to 4 GiB, identity mapped) and `VBAR_EL1`, then turns the MMU
//! and both caches on. The boot CPU then zeroes `.bss`. Each CPU takes its
//! own stack and points `TPIDR_EL1` at its per-CPU block before calling
//! Rust. (Real hardware would also invalidate the data cache by set/way
//! before turning it on; QEMU models no caches.)

use core::arch::global_asm;
use core::mem::size_of;

use super::cpu::{CPUS, MAX_CPUS, PerCpuBlock, STACK_SIZE};

/// `MAIR_EL1`: attribute 0 Device-nGnRnE, attribute 1 Normal memory,
/// write-back read/write-allocate, inner and outer.
const MAIR: u64 = 0xff << 8;

/// `TCR_EL1`: T0SZ 25 (39-bit addresses, walks start at level 1), table
/// walks write-back cacheable and inner shareable, 4 KiB granule, no
/// TTBR1 walks (EPD1), 36-bit physical addresses (IPS 1).
const TCR: u64 = 25 | (1 << 8) | (1 << 10) | (3 << 12) | (1 << 23) | (1 << 32);

/// Level-1 block descriptor for device memory: attribute 0, access flag,
/// never executable (PXN, UXN).
const BLOCK_DEVICE: u64 = 0b01 | (1 << 10) | (1 << 53) | (1 << 54);

/// Level-1 block descriptor for RAM: attribute 1, inner shareable, access
/// flag, EL1 read/write.
const BLOCK_NORMAL: u64 = 0b01 | (1 << 2) | (3 << 8) | (1 << 10);

/// `SCTLR_EL1`: the ARMv8.0 RES1 bits (11, 20, 22, 23, 28, 29), MMU on (M),
/// data and instruction caches on (C, I); alignment checks off,
/// little-endian.
const SCTLR: u64 = 0x30D0_0800 | 1 | (1 << 2) | (1 << 12);

global_asm!(
    // The arm64 Image header (Linux Documentation/arch/arm64/booting.rst).
    ".pushsection .text.head, \"ax\"",
    ".global _start",
    "_start:",
    "    b       primary_entry",      // code0
    "    .long   0",                  // code1
    "    .quad   0x200000",           // text_offset: load at RAM + 2 MiB
    "    .quad   __kernel_size",      // image_size, .bss included
    "    .quad   2",                  // flags: little endian, 4 KiB pages
    "    .quad   0, 0, 0",            // reserved
    "    .ascii  \"ARM\\x64\"",       // magic
    "    .long   0",                  // reserved (PE/COFF offset)
    ".popsection",
    //
    ".pushsection .text.boot, \"ax\"",
    // Boot CPU: x0 = device tree. kmain(device tree, entry EL).
    "primary_entry:",
    "    msr     daifset, #0xf",
    "    mov     x19, x0",
    "    mrs     x21, CurrentEL",
    "    bl      drop_to_el1",
    "    bl      cpu_setup",
    "    adrp    x0, __bss_start",
    "    add     x0, x0, :lo12:__bss_start",
    "    adrp    x1, __bss_end",
    "    add     x1, x1, :lo12:__bss_end",
    "1:  cmp     x0, x1",
    "    b.hs    2f",
    "    stp     xzr, xzr, [x0], #16",
    "    b       1b",
    "2:  mov     x20, #0",
    "    bl      enter_cpu",
    "    mov     x0, x19",
    "    lsr     x1, x21, #2",
    "    bl      {kmain}",
    "    b       park",
    //
    // Secondary CPUs (PSCI CPU_ON): x0 = context id = CPU index.
    ".global secondary_entry",
    "secondary_entry:",
    "    msr     daifset, #0xf",
    "    mov     x20, x0",
    "    bl      drop_to_el1",
    "    bl      cpu_setup",
    "    bl      enter_cpu",
    "    mov     x0, x20",
    "    bl      {secondary_main}",
    "park:",
    "    msr     daifset, #0xf",
    "    wfe",
    "    b       park",
    //
    // sp = top of stack x20, TPIDR_EL1 = &CPUS[x20]. Clobbers x1-x3.
    "enter_cpu:",
    "    adrp    x1, boot_stacks",
    "    add     x1, x1, :lo12:boot_stacks",
    "    add     x2, x20, #1",
    "    ldr     x3, ={stack_size}",
    "    madd    x1, x2, x3, x1",
    "    mov     sp, x1",
    "    adrp    x1, {cpus}",
    "    add     x1, x1, :lo12:{cpus}",
    "    ldr     x3, ={block_size}",
    "    madd    x1, x20, x3, x1",
    "    msr     tpidr_el1, x1",
    "    ret",
    //
    // At EL2 (QEMU with virtualization=on): continue at EL1 with EL1 in
    // AArch64, the counters and timers open to EL1, no virtual offset.
    // Clobbers x0.
    "drop_to_el1:",
    "    mrs     x0, CurrentEL",
    "    cmp     x0, #(2 << 2)",
    "    b.ne    1f",
    "    mov     x0, #(1 << 31)",
    "    msr     hcr_el2, x0",
    "    mrs     x0, cnthctl_el2",
    "    orr     x0, x0, #3",
    "    msr     cnthctl_el2, x0",
    "    msr     cntvoff_el2, xzr",
    "    mov     x0, #0x3c5", // EL1h, DAIF masked
    "    msr     spsr_el2, x0",
    "    msr     elr_el2, x30",
    "    eret",
    "1:  ret",
    //
    // FP/SIMD, translation registers, vectors, then MMU and caches on.
    // Clobbers x0.
    "cpu_setup:",
    "    mov     x0, #(3 << 20)",
    "    msr     cpacr_el1, x0",
    "    ldr     x0, ={mair}",
    "    msr     mair_el1, x0",
    "    ldr     x0, ={tcr}",
    "    msr     tcr_el1, x0",
    "    adrp    x0, boot_l1",
    "    add     x0, x0, :lo12:boot_l1",
    "    msr     ttbr0_el1, x0",
    "    adrp    x0, vectors",
    "    add     x0, x0, :lo12:vectors",
    "    msr     vbar_el1, x0",
    "    isb",
    "    tlbi    vmalle1",
    "    ic      iallu",
    "    dsb     nsh",
    "    isb",
    "    ldr     x0, ={sctlr}",
    "    msr     sctlr_el1, x0",
    "    isb",
    "    ret",
    ".ltorg",
    ".popsection",
    //
    // The identity map: one level-1 table of 1 GiB blocks.
    ".pushsection .rodata.boot_l1, \"a\"",
    ".balign 4096",
    "boot_l1:",
    "    .quad   {dev}",                    // [0, 1 GiB): GIC, UART, ...
    "    .quad   (1 << 30) | {normal}",     // [1, 2 GiB): RAM
    "    .quad   (2 << 30) | {normal}",
    "    .quad   (3 << 30) | {normal}",
    "    .fill   508, 8, 0",
    ".popsection",
    //
    ".pushsection .bss.boot_stacks, \"aw\", %nobits",
    ".balign 4096",
    "boot_stacks:",
    "    .skip   {stacks_bytes}",
    ".popsection",
    //
    // Exception vectors: IRQs from EL1 with SP_EL1 go to `irq_entry`,
    // everything else is fatal.
    ".pushsection .text.vectors, \"ax\"",
    ".balign 2048",
    "vectors:",
    ".irp kind, 0, 1, 2, 3, 4",
    "    .balign 0x80",
    "    mov     x0, #\\kind",
    "    b       fault_entry",
    ".endr",
    "    .balign 0x80", // 5: current EL, SP_ELx, IRQ
    "    b       irq_entry",
    ".irp kind, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15",
    "    .balign 0x80",
    "    mov     x0, #\\kind",
    "    b       fault_entry",
    ".endr",
    //
    "fault_entry:",
    "    mrs     x1, esr_el1",
    "    mrs     x2, elr_el1",
    "    mrs     x3, far_el1",
    "    bl      {fault}",
    "    b       park",
    //
    // Saves what the interrupted code may hold in caller-saved registers
    // (x0-x18, x29, x30, every vector register, FPCR, FPSR) and the
    // exception state, calls `irq_handler`, restores, returns.
    "irq_entry:",
    "    sub     sp, sp, #720",
    "    stp     x0, x1, [sp, #0]",
    "    stp     x2, x3, [sp, #16]",
    "    stp     x4, x5, [sp, #32]",
    "    stp     x6, x7, [sp, #48]",
    "    stp     x8, x9, [sp, #64]",
    "    stp     x10, x11, [sp, #80]",
    "    stp     x12, x13, [sp, #96]",
    "    stp     x14, x15, [sp, #112]",
    "    stp     x16, x17, [sp, #128]",
    "    stp     x18, x29, [sp, #144]",
    "    mrs     x0, elr_el1",
    "    stp     x30, x0, [sp, #160]",
    "    mrs     x1, spsr_el1",
    "    mrs     x2, fpcr",
    "    stp     x1, x2, [sp, #176]",
    "    mrs     x3, fpsr",
    "    str     x3, [sp, #192]",
    "    add     x0, sp, #208",
    "    stp     q0, q1, [x0, #0]",
    "    stp     q2, q3, [x0, #32]",
    "    stp     q4, q5, [x0, #64]",
    "    stp     q6, q7, [x0, #96]",
    "    stp     q8, q9, [x0, #128]",
    "    stp     q10, q11, [x0, #160]",
    "    stp     q12, q13, [x0, #192]",
    "    stp     q14, q15, [x0, #224]",
    "    stp     q16, q17, [x0, #256]",
    "    stp     q18, q19, [x0, #288]",
    "    stp     q20, q21, [x0, #320]",
    "    stp     q22, q23, [x0, #352]",
    "    stp     q24, q25, [x0, #384]",
    "    stp     q26, q27, [x0, #416]",
    "    stp     q28, q29, [x0, #448]",
    "    stp     q30, q31, [x0, #480]",
    "    bl      {irq}",
    "    add     x0, sp, #208",
    "    ldp     q0, q1, [x0, #0]",
    "    ldp     q2, q3, [x0, #32]",
    "    ldp     q4, q5, [x0, #64]",
    "    ldp     q6, q7, [x0, #96]",
    "    ldp     q8, q9, [x0, #128]",
    "    ldp     q10, q11, [x0, #160]",
    "    ldp     q12, q13, [x0, #192]",
    "    ldp     q14, q15, [x0, #224]",
    "    ldp     q16, q17, [x0, #256]",
    "    ldp     q18, q19, [x0, #288]",
    "    ldp     q20, q21, [x0, #320]",
    "    ldp     q22, q23, [x0, #352]",
    "    ldp     q24, q25, [x0, #384]",
    "    ldp     q26, q27, [x0, #416]",
    "    ldp     q28, q29, [x0, #448]",
    "    ldp     q30, q31, [x0, #480]",
    "    ldr     x3, [sp, #192]",
    "    msr     fpsr, x3",
    "    ldp     x1, x2, [sp, #176]",
    "    msr     fpcr, x2",
    "    msr     spsr_el1, x1",
    "    ldp     x30, x0, [sp, #160]",
    "    msr     elr_el1, x0",
    "    ldp     x18, x29, [sp, #144]",
    "    ldp     x16, x17, [sp, #128]",
    "    ldp     x14, x15, [sp, #112]",
    "    ldp     x12, x13, [sp, #96]",
    "    ldp     x10, x11, [sp, #80]",
    "    ldp     x8, x9, [sp, #64]",
    "    ldp     x6, x7, [sp, #48]",
    "    ldp     x4, x5, [sp, #32]",
    "    ldp     x2, x3, [sp, #16]",
    "    ldp     x0, x1, [sp, #0]",
    "    add     sp, sp, #720",
    "    eret",
    ".popsection",
    kmain = sym super::kmain,
    secondary_main = sym super::secondary_main,
    irq = sym super::irq::irq_handler,
    fault = sym super::fault,
    cpus = sym CPUS,
    stack_size = const STACK_SIZE,
    stacks_bytes = const STACK_SIZE * MAX_CPUS,
    block_size = const size_of::<PerCpuBlock>(),
    mair = const MAIR,
    tcr = const TCR,
    sctlr = const SCTLR,
    dev = const BLOCK_DEVICE,
    normal = const BLOCK_NORMAL,
);

unsafe extern "C" {
    /// Where PSCI `CPU_ON` starts a secondary CPU (`x0` = its index).
    pub fn secondary_entry();
}
