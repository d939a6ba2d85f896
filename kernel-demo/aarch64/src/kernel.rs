//! The kernel: entry points, the global allocator, the panic and fault
//! handlers, QEMU exit.

mod arch;
mod bench;
mod boot;
mod cpu;
mod dtb;
mod icount;
mod irq;
mod memory;
mod selftest;
pub(crate) mod serial;
mod sync;

use core::panic::PanicInfo;
use core::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use kmemcg::{IrqSpinLock, Kmem, NoCpus, PerCpu, Region};

use cpu::{Conduit, Hw};
use dtb::DeviceTree;
use kernel_common::numa;
use serial::kprintln;

/// The lock type of every allocator lock: masks IRQs while held.
pub type Lock = IrqSpinLock<Hw>;
/// The kernel heap's type.
pub type Heap = kernel_common::Heap<Hw>;
/// A one-CPU heap (no per-CPU slots: every operation takes the shared,
/// locked path), for comparison.
pub type SoloHeap = Kmem<Region<Lock>, Lock, NoCpus>;

/// The kernel heap: CPU `i` owns magazine slot `kmemcg::slot_for_cpu(i)`,
/// held with IRQs masked.
#[global_allocator]
pub static KMEM: Heap = Kmem::with_platform(Region::new(), PerCpu::new());

/// The comparison heap, over its own slice of RAM.
pub static SOLO: SoloHeap = Kmem::with_platform(Region::new(), NoCpus::new());

/// The NUMA boot's heap (`numa` in `bootargs`): each node's RAM as that
/// node's regions, and a platform that knows each CPU's node.
pub type NumaHeap = kernel_common::NumaHeap<Hw>;

/// The NUMA boot's heap (see `numa.rs`); the global heap gets a slice of
/// node 0 for the kernel's own allocations.
pub static KMEM_NUMA: NumaHeap = Kmem::with_platform(Region::new(), PerCpu::new());

/// What the secondary CPUs run: [`MODE_SELFTEST`], [`MODE_NUMA`] or
/// [`MODE_NUMA_ICOUNT`] (set by the boot CPU before it starts them).
static MODE: AtomicU8 = AtomicU8::new(MODE_SELFTEST);
const MODE_SELFTEST: u8 = 0;
const MODE_NUMA: u8 = 1;
const MODE_NUMA_ICOUNT: u8 = 2;

/// Timer interrupts per second on each CPU.
const TIMER_HZ: u64 = 1000;

/// The boot CPU's Rust entry (boot.rs), at EL1 with the MMU on: the
/// device tree's address and the exception level QEMU started it at.
extern "C" fn kmain(dtb_addr: usize, entry_el: u64) -> ! {
    kprintln!(
        "kernel-demo-aarch64: CPU 0 entered at EL{entry_el}, runs at EL1, MMU and caches on, device tree at {dtb_addr:#x}"
    );
    // SAFETY: QEMU's loader passed the device tree's address in x0 and
    // nothing has written to RAM outside this image since; all RAM is
    // mapped.
    let dt = unsafe { DeviceTree::read(dtb_addr) }.unwrap_or_else(|e| fail(e));
    let (gicd, gicc) = (dt.gicd.unwrap_or(0x0800_0000), dt.gicc.unwrap_or(0x0801_0000));
    let timer = dt.timer_intid.unwrap_or(27);
    let conduit = dt.psci.unwrap_or(Conduit::Hvc);
    kprintln!(
        "device tree: {} CPUs, GIC distributor {gicd:#x}, CPU interface {gicc:#x}, timer INTID {timer}, PL011 {:#x}, PSCI {conduit:?}",
        dt.cpu_count,
        dt.uart.unwrap_or(0)
    );
    if dt.numa {
        // `run-qemu.sh aarch64 numa` (or `numa-icount`): the two-node test.
        cpu::set_conduit(conduit);
        match numa_run(&dt) {
            Ok(()) => exit_qemu(true),
            Err(e) => fail(e),
        }
    }
    memory::give_ram(&dt).unwrap_or_else(|e| fail(e));
    if let Some(bytes) = dt.heap {
        // `run-qemu.sh aarch64 heap=KIB`: the tutorial heap suite only.
        match kernel_common::small_heap::run::<arch::Aarch64>(bytes) {
            Ok(()) => exit_qemu(true),
            Err(e) => fail(e),
        }
    }
    if dt.icount {
        // `scripts/kernel-icount.sh`: instruction counts only, on this CPU.
        match icount::run() {
            Ok(()) => exit_qemu(true),
            Err(e) => fail(e),
        }
    }

    cpu::set_conduit(conduit);
    irq::configure(gicd as usize, gicc as usize, timer, TIMER_HZ);
    irq::init_distributor();
    irq::init_this_cpu();
    cpu::CPUS[0].online.store(true, Ordering::Release);

    let ncpus = start_secondaries(&dt);
    kprintln!("smp: {ncpus} CPUs online, timer at {TIMER_HZ} Hz on each");
    match selftest::run(ncpus) {
        Ok(()) => {
            kprintln!("kmemcg kernel self-test: PASS");
            exit_qemu(true)
        }
        Err(e) => fail(e),
    }
}

/// Starts every other CPU of the device tree with PSCI `CPU_ON`, waits for
/// them; returns the number of CPUs online.
fn start_secondaries(dt: &DeviceTree) -> usize {
    let me = mpidr();
    let mut next = 1;
    for &target in &dt.cpus[..dt.cpu_count] {
        if target == me || next >= cpu::MAX_CPUS {
            continue;
        }
        let entry = boot::secondary_entry as *const () as usize;
        let status = cpu::cpu_on(target, entry, next as u64);
        if status != 0 {
            kprintln!("smp: PSCI CPU_ON of MPIDR {target:#x} failed: {status}");
            continue;
        }
        let deadline = cpu::ticks() + 10 * cpu::ticks_per_second();
        while !cpu::CPUS[next].online.load(Ordering::Acquire) {
            if cpu::ticks() > deadline {
                fail("a secondary CPU did not come up");
            }
            core::hint::spin_loop();
        }
        next += 1;
    }
    next
}

/// The NUMA boot: hands each node's RAM to `KMEM_NUMA`, numbers the CPUs
/// as `start_secondaries` will and gives each the `numa-node-id` of its
/// device tree node, starts them (no GIC, no timer: nothing interrupts
/// the test or the counts), and runs the two-node test on all of them
/// (or, with `icount`, measures on this CPU while the others are parked).
fn numa_run(dt: &DeviceTree) -> Result<(), &'static str> {
    let me = mpidr();
    let node_of = |i: usize| dt.cpu_node[i] as usize;
    let boot = (0..dt.cpu_count).find(|&i| dt.cpus[i] == me).ok_or("the boot CPU is not in the device tree")?;
    numa::set_cpu_node(0, node_of(boot))?;
    let mut n = 1;
    for i in (0..dt.cpu_count).filter(|&i| i != boot) {
        if n < cpu::MAX_CPUS {
            numa::set_cpu_node(n, node_of(i))?;
            n += 1;
        }
    }
    memory::give_ram_numa(dt)?;
    numa::start::<arch::Aarch64>(n, dt.icount)?;
    MODE.store(if dt.icount { MODE_NUMA_ICOUNT } else { MODE_NUMA }, Ordering::Release);
    if start_secondaries(dt) != n {
        return Err("not every CPU came up");
    }
    kprintln!("smp: {n} CPUs online, no timer");
    if dt.icount {
        return numa::measure::<arch::Aarch64>(cpu::ticks, icount::ticks_per_insn()?);
    }
    numa::cpu_part::<arch::Aarch64>(0)?;
    kprintln!("kmemcg numa self-test: PASS");
    Ok(())
}

/// This CPU's affinity fields (MPIDR_EL1 without the flag bits).
fn mpidr() -> u64 {
    let m: u64;
    // SAFETY: reads an identification register.
    unsafe { core::arch::asm!("mrs {}, mpidr_el1", out(reg) m, options(nomem, nostack, preserves_flags)) };
    m & 0xff_00ff_ffff
}

/// A secondary CPU's Rust entry (boot.rs), MMU on, `index` from `CPU_ON`.
extern "C" fn secondary_main(index: usize) -> ! {
    match MODE.load(Ordering::Acquire) {
        MODE_NUMA => {
            cpu::CPUS[index].online.store(true, Ordering::Release);
            if let Err(e) = numa::cpu_part::<arch::Aarch64>(index) {
                fail(e);
            }
        }
        MODE_NUMA_ICOUNT => {
            // The node-1 partner of CPU 0 allocates the objects CPU 0
            // frees remotely; every secondary then sleeps for good (no
            // interrupt is enabled), so only CPU 0 runs while it counts.
            cpu::CPUS[index].online.store(true, Ordering::Release);
            numa::remote_part::<arch::Aarch64>(index);
        }
        _ => {
            irq::init_this_cpu();
            cpu::CPUS[index].online.store(true, Ordering::Release);
            selftest::secondary(index);
        }
    }
    loop {
        cpu::wait_for_interrupt();
    }
}

/// Prints the FAIL line and exits QEMU with failure.
fn fail(reason: &str) -> ! {
    kprintln!("kmemcg kernel self-test: FAIL: {reason}");
    exit_qemu(false)
}

#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    kprintln!("kernel panic on CPU {}: {info}", cpu::id());
    fail("panic")
}

/// Set once a CPU starts exiting QEMU.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Every exception but an EL1 IRQ (boot.rs): prints it and fails. (While
/// exiting, the exception is the semihosting trap without `-semihosting`:
/// power off instead.)
extern "C" fn fault(kind: u64, esr: u64, elr: u64, far: u64) -> ! {
    if EXITING.load(Ordering::Relaxed) {
        power_off();
    }
    kprintln!("CPU {}: exception {kind} (vector), ESR {esr:#x}, ELR {elr:#x}, FAR {far:#x}", cpu::id());
    fail("unexpected exception")
}

/// Exits QEMU: semihosting `SYS_EXIT` with `ADP_Stopped_ApplicationExit`
/// and status 0 or 1 (needs `-semihosting`); if that returns or traps,
/// PSCI `SYSTEM_OFF` (status 0: the run script also wants the PASS line).
fn exit_qemu(success: bool) -> ! {
    if !EXITING.swap(true, Ordering::Relaxed) {
        /// `SYS_EXIT`.
        const SYS_EXIT: u64 = 0x18;
        /// `ADP_Stopped_ApplicationExit`.
        const APPLICATION_EXIT: u64 = 0x2_0026;
        let block: [u64; 2] = [APPLICATION_EXIT, if success { 0 } else { 1 }];
        // SAFETY: the A64 semihosting trap: x0 = operation, x1 = address
        // of its parameter block, which lives across the call. Without
        // semihosting, `hlt` traps as an undefined instruction, and the
        // fault handler, seeing `EXITING`, powers off.
        unsafe {
            core::arch::asm!("hlt #0xf000", inout("x0") SYS_EXIT => _, in("x1") block.as_ptr(), options(nostack))
        };
    }
    power_off()
}

/// PSCI `SYSTEM_OFF`, or this CPU stops.
fn power_off() -> ! {
    cpu::system_off();
    let _ = cpu::irq_save();
    loop {
        cpu::wait_for_interrupt();
    }
}
