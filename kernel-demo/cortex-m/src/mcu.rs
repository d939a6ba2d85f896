//! The program: the heap, the entry point after reset, failure and exit.

mod boot;
mod cpu;
mod demo;
pub(crate) mod semihosting;

use core::mem::MaybeUninit;
use core::panic::PanicInfo;

use kmemcg::{IrqSpinLock, Kmem, PerCpu, Region};

use cpu::Mcu;
use semihosting::println;

/// Every allocator lock: masks interrupts (`PRIMASK`) while held, so the
/// SysTick handler never spins on a lock the code it interrupted holds.
pub type Lock = IrqSpinLock<Mcu>;
/// The heap's type: one CPU slot, held with interrupts masked.
pub type Heap = Kmem<Region<Lock>, Lock, PerCpu<Mcu>>;

/// The heap.
#[global_allocator]
pub static KMEM: Heap = Kmem::with_platform(Region::new(), PerCpu::new());

/// Bytes of RAM the heap gets.
pub const HEAP_BYTES: usize = 64 << 10;

/// The heap's memory: page aligned, so no page of it goes to page
/// metadata (see the README's *Small memory*).
#[repr(C, align(4096))]
struct HeapMemory([MaybeUninit<u8>; HEAP_BYTES]);

/// Handed to `KMEM` once, by [`main`].
static mut HEAP: HeapMemory = HeapMemory([MaybeUninit::uninit(); HEAP_BYTES]);

/// Called by the reset handler with `.data` and `.bss` ready and the FPU
/// on; interrupts are enabled (`PRIMASK` clear at reset).
#[unsafe(no_mangle)]
extern "C" fn mcu_main() -> ! {
    println!("kernel-demo-cortex-m: Cortex-M4 up, heap type {} bytes", size_of::<Heap>());
    let heap = &raw mut HEAP;
    // SAFETY: the only reference ever made to `HEAP`, here, once, before
    // anything else runs; it lives for the rest of the program in `KMEM`.
    let memory: &'static mut [MaybeUninit<u8>] = unsafe { &mut (*heap).0 };
    let at = memory.as_ptr() as usize;
    if let Err(e) = KMEM.source().add(memory, 0) {
        println!("kmemcg refused the heap: {e}");
        fail("the heap region was refused");
    }
    println!(
        "heap: {} KiB at {at:#x}, {} free pages, slab order cap {}",
        HEAP_BYTES >> 10,
        KMEM.source().free_pages_on(0),
        KMEM.max_slab_order()
    );
    match demo::run(&KMEM) {
        Ok(()) => {
            println!("kmemcg cortex-m demo: PASS");
            semihosting::exit(0)
        }
        Err(e) => fail(e),
    }
}

/// Prints the FAIL line (with the allocator's last shortage) and exits
/// with status 1.
fn fail(reason: &str) -> ! {
    cpu::stop_systick();
    if let Some(r) = KMEM.last_oom() {
        println!("last shortage: {r}");
    }
    println!("kmemcg cortex-m demo: FAIL: {reason}");
    semihosting::exit(1)
}

#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    println!("panic: {info}");
    fail("panic")
}
