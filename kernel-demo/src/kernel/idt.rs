//! The interrupt descriptor table (one, loaded on every CPU), the entry
//! stubs, and the handlers: CPU exceptions (fatal: print and fail), the
//! local APIC timer (allocates and frees in interrupt context), the wake
//! IPI and the spurious vector.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::alloc::Layout;
use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU64, Ordering};

use super::apic;
use super::cpu;
use super::serial::kprintln;
use super::vectors::{PIC_VECTOR_BASE, SPURIOUS_VECTOR, TIMER_VECTOR, WAKE_VECTOR};

/// The 64-bit code selector of the boot and trampoline GDTs.
const KERNEL_CS: u64 = 0x08;
/// Present, DPL 0, 64-bit interrupt gate (interrupts masked on entry).
const INTERRUPT_GATE: u64 = 0x8E;

// Entry stubs. The CPU pushes SS, RSP, RFLAGS, CS, RIP (after aligning
// RSP to 16), and an error code for some exceptions; the exception stubs
// push a dummy error code where the CPU does not, then the vector. Each
// stub saves the caller-saved registers (the kernel is soft-float: no
// SSE state to save), leaving RSP 16-aligned for the call, and returns
// with `iretq`.
global_asm!(
    ".pushsection .text.isr, \"ax\"",
    ".macro save_regs",
    "    push rax",
    "    push rcx",
    "    push rdx",
    "    push rsi",
    "    push rdi",
    "    push r8",
    "    push r9",
    "    push r10",
    "    push r11",
    "    cld",
    ".endm",
    ".macro restore_regs",
    "    pop r11",
    "    pop r10",
    "    pop r9",
    "    pop r8",
    "    pop rdi",
    "    pop rsi",
    "    pop rdx",
    "    pop rcx",
    "    pop rax",
    ".endm",
    ".macro exception_stub vec, err",
    "isr_exception_\\vec:",
    ".if \\err == 0",
    "    push 0",
    ".endif",
    "    push \\vec",
    "    jmp isr_exception_common",
    ".endm",
    ".irp v, 0,1,2,3,4,5,6,7,9,15,16,18,19,20,22,23,24,25,26,27,28,31",
    "    exception_stub \\v, 0",
    ".endr",
    ".irp v, 8,10,11,12,13,14,17,21,29,30",
    "    exception_stub \\v, 1",
    ".endr",
    "isr_exception_common:",
    "    save_regs",
    "    mov rdi, rsp",
    "    call {exception}",
    "    ud2",
    ".global isr_timer",
    "isr_timer:",
    "    save_regs",
    "    call {timer}",
    "    restore_regs",
    "    iretq",
    ".global isr_wake",
    "isr_wake:",
    "    save_regs",
    "    call {wake}",
    "    restore_regs",
    "    iretq",
    ".global isr_spurious",
    "isr_spurious:",
    "    iretq",
    ".popsection",
    ".pushsection .rodata.isr_table, \"a\"",
    ".balign 8",
    ".global isr_exception_table",
    "isr_exception_table:",
    ".irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31",
    "    .quad isr_exception_\\v",
    ".endr",
    ".popsection",
    exception = sym exception,
    timer = sym timer_interrupt,
    wake = sym wake_interrupt,
);

unsafe extern "C" {
    /// The 32 exception stubs' addresses, by vector.
    static isr_exception_table: [u64; 32];
    fn isr_timer();
    fn isr_wake();
    fn isr_spurious();
}

/// The IDT: 256 gates of two quadwords, written once by the BSP before
/// any CPU loads it.
#[repr(C, align(16))]
struct Idt([AtomicU64; 512]);

static IDT: Idt = Idt([const { AtomicU64::new(0) }; 512]);

fn set_gate(vector: u8, handler: u64) {
    let low = (handler & 0xFFFF) | (KERNEL_CS << 16) | (INTERRUPT_GATE << 40) | ((handler >> 16) & 0xFFFF) << 48;
    let v = usize::from(vector);
    IDT.0[2 * v].store(low, Ordering::Relaxed);
    IDT.0[2 * v + 1].store(handler >> 32, Ordering::Relaxed);
}

/// Fills the IDT (BSP, once, before any CPU calls [`load`]).
pub fn init() {
    // SAFETY: a table of 32 addresses the assembly above defines.
    let exceptions = unsafe { &isr_exception_table };
    for (v, &h) in exceptions.iter().enumerate() {
        set_gate(v as u8, h);
    }
    set_gate(TIMER_VECTOR, isr_timer as *const () as u64);
    set_gate(WAKE_VECTOR, isr_wake as *const () as u64);
    for v in PIC_VECTOR_BASE..PIC_VECTOR_BASE + 16 {
        set_gate(v, isr_spurious as *const () as u64);
    }
    set_gate(SPURIOUS_VECTOR, isr_spurious as *const () as u64);
}

/// Loads the IDT on the calling CPU.
pub fn load() {
    #[repr(C, packed)]
    struct Pointer {
        limit: u16,
        base: u64,
    }
    let ptr = Pointer { limit: (core::mem::size_of::<Idt>() - 1) as u16, base: &raw const IDT as u64 };
    // SAFETY: the IDT is a static, filled by `init` before any CPU loads
    // it, whose gates point at the stubs above; `lidt` reads the 10-byte
    // pointer.
    unsafe { asm!("lidt [{}]", in(reg) &ptr, options(readonly, nostack, preserves_flags)) };
}

/// What the exception stubs leave on the stack.
#[repr(C)]
struct ExceptionFrame {
    regs: [u64; 9],
    vector: u64,
    error: u64,
    rip: u64,
    cs: u64,
    rflags: u64,
    rsp: u64,
}

/// Any CPU exception: print it and fail.
extern "C" fn exception(frame: &ExceptionFrame) -> ! {
    let cr2: u64;
    // SAFETY: reading CR2 (the faulting address of a page fault).
    unsafe { asm!("mov {}, cr2", out(reg) cr2, options(nomem, nostack, preserves_flags)) };
    kprintln!(
        "exception {} on cpu index {}: error {:#x}, rip {:#x}, rsp {:#x}, rflags {:#x}, cr2 {:#x}",
        frame.vector,
        cpu::index(),
        frame.error,
        frame.rip,
        frame.rsp,
        frame.rflags,
        cr2
    );
    super::fail("CPU exception")
}

/// The local APIC timer: while its CPU runs the workload (`allocating`), a
/// `Box<[u8; 64]>` and a small `Vec`, allocated, checked and freed in
/// interrupt context, counted per CPU.
extern "C" fn timer_interrupt() {
    let me = cpu::this();
    me.irq_enter();
    me.ticks.fetch_add(1, Ordering::Relaxed);
    if me.allocating.load(Ordering::Relaxed) {
        match irq_allocations() {
            Ok(n) => me.irq_allocs.fetch_add(n, Ordering::Relaxed),
            Err(()) => me.irq_failures.fetch_add(1, Ordering::Relaxed),
        };
    }
    me.irq_exit();
    apic::eoi();
}

/// Allocates, checks and frees two objects; returns how many it
/// allocated. No panics: failures are errors.
fn irq_allocations() -> Result<usize, ()> {
    let layout = Layout::new::<[u8; 64]>();
    // SAFETY: a 64-byte layout; on success the block is owned by the Box
    // below, which frees it with the same layout.
    let p = unsafe { alloc::alloc::alloc(layout) };
    if p.is_null() {
        return Err(());
    }
    // SAFETY: `p` is a fresh block for `[u8; 64]` from the global
    // allocator; writing the array initialises it before the Box owns it.
    let mut block: Box<[u8; 64]> = unsafe {
        p.cast::<[u8; 64]>().write([0x5A; 64]);
        Box::from_raw(p.cast())
    };
    block[63] = 0xA5;
    let mut v: Vec<u32> = Vec::new();
    v.try_reserve_exact(12).map_err(|_| ())?;
    v.extend(0..12);
    let ok = block[0] == 0x5A && block[63] == 0xA5 && v.iter().sum::<u32>() == 66;
    drop((block, v));
    if ok { Ok(2) } else { Err(()) }
}

/// The wake IPI: nothing to do but acknowledge it.
extern "C" fn wake_interrupt() {
    apic::eoi();
}
