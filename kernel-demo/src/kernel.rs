//! The kernel: entry point, global allocator, panic handler, QEMU exit.

mod boot;
mod memory;
mod selftest;
pub(crate) mod serial;

use core::panic::PanicInfo;

use kmemcg::{Kmem, Region};

use memory::BootInfo;
use serial::{Serial, kprintln};

/// The kernel heap. Without `std`, `Kmem<Region>` uses `NoCpus` (no
/// per-CPU slots, one current group), which suits this single-CPU kernel
/// that never enables interrupts, and `spin` locks.
#[global_allocator]
static KMEM: Kmem<Region> = Kmem::new(Region::new());

/// What the bootloader leaves in `eax` for a multiboot v1 kernel.
const MULTIBOOT_MAGIC: u32 = 0x2BAD_B002;

/// Called by the boot stub in 64-bit mode with the multiboot registers.
extern "C" fn kmain(magic: u32, info: u32) -> ! {
    Serial::init();
    kprintln!("kernel-demo: in long mode, serial up");
    if magic != MULTIBOOT_MAGIC {
        fail("not booted by a multiboot loader");
    }
    // SAFETY: a multiboot loader passed `info` in `ebx`, and nothing has
    // touched memory since; the boot stub identity-maps the low 4 GiB.
    let boot = unsafe { BootInfo::read(info as usize) }.unwrap_or_else(|e| fail(e));
    match boot.give_ram_to_kmem() {
        Ok(bytes) => kprintln!("heap: {} MiB in {} free pages", bytes >> 20, KMEM.source().free_pages_on(0)),
        Err(e) => fail(e),
    }
    match selftest::run(&KMEM) {
        Ok(()) => {
            kprintln!("kmemcg kernel self-test: PASS");
            exit_qemu(QemuExit::Success)
        }
        Err(e) => fail(e),
    }
}

fn fail(reason: &str) -> ! {
    kprintln!("kmemcg kernel self-test: FAIL: {reason}");
    exit_qemu(QemuExit::Failure)
}

#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    kprintln!("kernel panic: {info}");
    fail("panic")
}

/// Values for QEMU's `isa-debug-exit` device; QEMU exits with status
/// `(value << 1) | 1`: 33 for success, 35 for failure.
#[derive(Clone, Copy)]
#[repr(u32)]
enum QemuExit {
    Success = 0x10,
    Failure = 0x11,
}

/// Stops QEMU (`-device isa-debug-exit,iobase=0xf4,iosize=0x04`); halts
/// forever where there is no such device.
fn exit_qemu(code: QemuExit) -> ! {
    // SAFETY: port 0xf4 is the debug-exit device under QEMU, and unused on
    // a PC otherwise; the write touches no memory.
    unsafe {
        core::arch::asm!("out dx, eax", in("dx") 0xf4u16, in("eax") code as u32, options(nomem, nostack));
    }
    loop {
        // SAFETY: interrupts are off: halts this CPU for good.
        unsafe { core::arch::asm!("cli; hlt", options(nomem, nostack)) };
    }
}
