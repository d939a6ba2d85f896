//! The kernel: entry points (BSP and APs), the global allocator, the SMP
//! run, panic handler, QEMU exit.

mod acpi;
mod apic;
mod arch;
mod bench;
mod boot;
mod cpu;
mod icount;
mod idt;
mod memory;
mod port;
pub(crate) mod serial;
mod smp;
mod time;
mod vectors;

use core::panic::PanicInfo;
use core::sync::atomic::Ordering;

use kmemcg::{IrqSpinLock, Kmem, NoCpus, PerCpu, Region};

use arch::X86_64;
use cpu::{Hw, MAX_SMP};
use kernel_common::{numa, selftest};
use memory::BootInfo;
use serial::{Serial, kprintln};
use smp::phase;

/// The kernel heap's type: kmemcg over the RAM of the memory map, with
/// interrupt-masking locks and one magazine slot per CPU.
pub type Heap = kernel_common::Heap<Hw>;

/// The kernel heap.
#[global_allocator]
static KMEM: Heap = Kmem::with_platform(Region::new(), PerCpu::new());

/// A second allocator for the benchmark: the same locks, no per-CPU slots
/// (every operation takes the shared, locked path).
static KMEM_NOCPUS: Kmem<Region<IrqSpinLock<Hw>>, IrqSpinLock<Hw>, NoCpus> =
    Kmem::with_platform(Region::new(), NoCpus::new());

/// The NUMA boot's heap (`numa` on the command line): each node's RAM as
/// that node's regions, and a platform that knows each CPU's node.
pub type NumaHeap = kernel_common::NumaHeap<Hw>;

/// The NUMA boot's heap (see `numa.rs`); the global heap gets a slice of
/// node 0 for the kernel's own allocations.
static KMEM_NUMA: NumaHeap = Kmem::with_platform(Region::new(), PerCpu::new());

/// What a multiboot v1 loader leaves in `eax`.
const MULTIBOOT_MAGIC: u32 = 0x2BAD_B002;

/// Called by the boot stub in 64-bit mode with the multiboot registers.
extern "C" fn kmain(magic: u32, info: u32) -> ! {
    // SAFETY: first thing on the BSP, which is CPU 0; nothing has read
    // per-CPU state yet. Its APIC ID is filled in once the APIC is up.
    unsafe { cpu::set_this_cpu(0, 0) };
    Serial::init();
    kprintln!("kernel-demo: in long mode, serial up");
    idt::init();
    idt::load();
    if magic != MULTIBOOT_MAGIC {
        fail("not booted by a multiboot loader");
    }
    // SAFETY: a multiboot loader passed `info` in `ebx`, and nothing has
    // touched memory since; the boot stub identity-maps the low 4 GiB.
    let boot = unsafe { BootInfo::read(info as usize) }.unwrap_or_else(|e| fail(e));
    if boot.numa {
        // `run-qemu.sh ARCH numa` (or `numa-icount`): the two-node test.
        match numa_run(&boot) {
            Ok(()) => exit_qemu(QemuExit::Success),
            Err(e) => fail(e),
        }
    }
    match boot.give_ram_to_kmem() {
        Ok(bytes) => kprintln!("heap: {} KiB in {} free pages", bytes >> 10, KMEM.source().free_pages_on(0)),
        Err(e) => fail(e),
    }
    if let Some(bytes) = boot.heap {
        // `run-qemu.sh ARCH heap=KIB`: the tutorial heap suite only.
        match kernel_common::small_heap::run::<arch::X86_64>(bytes) {
            Ok(()) => exit_qemu(QemuExit::Success),
            Err(e) => fail(e),
        }
    }
    if boot.icount {
        // `scripts/kernel-icount.sh`: instruction counts only, on this CPU.
        match icount::run() {
            Ok(()) => exit_qemu(QemuExit::Success),
            Err(e) => fail(e),
        }
    }
    if let Err(e) = selftest::run::<X86_64>() {
        fail(e);
    }
    match smp_run() {
        Ok(()) => {
            kprintln!("kmemcg kernel self-test: PASS");
            exit_qemu(QemuExit::Success)
        }
        Err(e) => fail(e),
    }
}

/// Brings up the other CPUs, runs the workload on all of them, checks
/// and prints the per-CPU counts, then the benchmark (BSP).
fn smp_run() -> Result<(), &'static str> {
    let hz = time::calibrate();
    apic::disable_pic();
    apic::init()?;
    let bsp = apic::id();
    cpu::this().apic_id.store(bsp, Ordering::Relaxed);
    let per_ms = apic::calibrate_timer();
    kprintln!("time: TSC {} MHz, APIC timer {} counts/ms at divide 16", hz / 1_000_000, per_ms);
    let cpus = acpi::cpus()?;
    kprintln!("acpi: {} enabled CPUs in the MADT, APIC IDs {:?}", cpus.count, &cpus.ids[..cpus.count]);
    if cpus.ignored > 0 {
        kprintln!("acpi: {} more CPUs ignored (this kernel runs at most {MAX_SMP})", cpus.ignored);
    }
    let n = smp::start_aps(&cpus, bsp, ap_main)?;
    kprintln!("smp: {n} CPUs online");

    kernel_common::smp::boot_cpu::<X86_64>(n)?;
    bench::run(n)?;
    smp::set_phase(phase::END);
    Ok(())
}

/// The NUMA boot: reads the SRAT, hands each node's RAM to `KMEM_NUMA`,
/// numbers the CPUs as `smp::start_aps` will and gives each its node,
/// starts them, and runs the two-node test on all of them (or, with
/// `icount`, measures on this CPU while the others are parked).
fn numa_run(boot: &BootInfo) -> Result<(), &'static str> {
    time::calibrate();
    apic::disable_pic();
    apic::init()?;
    let bsp = apic::id();
    cpu::this().apic_id.store(bsp, Ordering::Relaxed);
    let cpus = acpi::cpus()?;
    let srat = acpi::srat()?;
    let node_of = |apic_id: u32| srat.node_of_apic(apic_id).ok_or("a CPU the SRAT does not place");
    numa::set_cpu_node(0, node_of(bsp)?)?;
    let mut n = 1;
    for &id in cpus.ids[..cpus.count].iter().filter(|&&id| id != bsp) {
        numa::set_cpu_node(n, node_of(id)?)?;
        n += 1;
    }
    boot.give_ram_numa(&srat)?;
    numa::start::<arch::X86_64>(n, boot.icount)?;
    let online = smp::start_aps(&cpus, bsp, if boot.icount { ap_numa_icount } else { ap_numa })?;
    if online != n {
        return Err("not every CPU came up");
    }
    if boot.icount {
        return numa::measure::<arch::X86_64>(time::rdtsc, icount::ticks_per_insn()?);
    }
    numa::cpu_part::<arch::X86_64>(0)?;
    kprintln!("kmemcg numa self-test: PASS");
    Ok(())
}

/// An application processor in the NUMA test.
extern "C" fn ap_numa(index: usize) -> ! {
    if let Err(e) = smp::ap_init(index).and_then(|()| numa::cpu_part::<arch::X86_64>(index)) {
        fail(e);
    }
    halt()
}

/// An application processor in the NUMA measurement: the node-1 partner
/// of CPU 0 allocates the objects CPU 0 frees remotely; every AP then
/// halts for good, so only CPU 0 runs while it counts.
extern "C" fn ap_numa_icount(index: usize) -> ! {
    if let Err(e) = smp::ap_init(index) {
        fail(e);
    }
    numa::remote_part::<arch::X86_64>(index);
    halt()
}

/// An application processor, from the trampoline on its own stack.
extern "C" fn ap_main(index: usize) -> ! {
    if let Err(e) = smp::ap_init(index) {
        fail(e);
    }
    kernel_common::smp::other_cpu::<X86_64>(index);
    smp::wait_phase(phase::BENCH);
    if let Err(e) = bench::all_cpus_part(index) {
        fail(e);
    }
    smp::arrive(phase::BENCH);
    smp::wait_phase(phase::END);
    halt()
}

/// Prints the FAIL line and exits QEMU with the failure status.
fn fail(reason: &str) -> ! {
    kprintln!("kmemcg kernel self-test: FAIL: {reason}");
    exit_qemu(QemuExit::Failure)
}

#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    kprintln!("kernel panic on cpu index {}: {info}", cpu::index());
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
    halt()
}

/// Halts this CPU for good.
fn halt() -> ! {
    loop {
        // SAFETY: masks interrupts and halts this CPU; touches no memory.
        unsafe { core::arch::asm!("cli; hlt", options(nomem, nostack)) };
    }
}
