//! The self-test on this kernel: the shared single-CPU checks
//! (`kernel_common::selftest`) on the boot CPU, then the shared SMP
//! workload (`kernel_common::workload`) on every CPU at once, between
//! barriers, with the timer allocating in interrupt context; then the boot
//! CPU checks the accounting, prints the per-CPU lines
//! (`kernel_common::report`) and runs the timing comparison (`bench`).

use core::sync::atomic::Ordering;

use kernel_common::publish::Published;
use kernel_common::report::{self, IrqCounts};
use kernel_common::selftest;
use kernel_common::workload::{self, Shared};

use super::arch::Aarch64;
use super::bench;
use super::cpu::{self, CPUS, Hw, MAX_CPUS};
use super::serial::kprintln;
use super::sync::{Barrier, Failure};
use super::{KMEM, irq};

type Test = Result<(), &'static str>;

/// How long a CPU waits for its first interrupt-context allocation, s.
const IRQ_WAIT_S: u64 = 10;

/// What the CPUs of the run share besides the workload's state: the
/// barrier that keeps them in step and each one's first failure.
struct Team {
    n: usize,
    barrier: Barrier,
    failures: [Failure; MAX_CPUS],
}

/// The [`Team`] of this boot (published after the workload's state).
static TEAM: Published = Published::new();

/// The boot CPU's part: the single-CPU checks, the workload with the
/// others, the checks and per-CPU lines, then the timing comparison.
pub fn run(n: usize) -> Test {
    selftest::run::<Aarch64>()?;
    let sh = workload::setup::<Aarch64>(n)?;
    // Published before the baseline is taken: it stays allocated.
    let team: &Team =
        TEAM.publish(Team { n, barrier: Barrier::new(n), failures: [const { Failure::new() }; MAX_CPUS] });
    KMEM.shrink();
    let root_before = KMEM.root().usage();
    let pages_before = KMEM.stats().source.pages_in_use;
    kprintln!("workload: starting on {n} CPUs");
    cpu::irq_enable();
    on_every_cpu(team, sh, 0);
    let mut failed = None;
    for (i, f) in team.failures[..n].iter().enumerate() {
        if let Some(e) = f.get() {
            kprintln!("workload: CPU {i} failed: {e}");
            failed = failed.or(Some(e));
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    workload::check_accounting::<Aarch64>(sh, root_before, pages_before)?;
    report::cpu_lines::<Aarch64>(n, |i| IrqCounts {
        allocations: CPUS[i].irq_allocs.load(Ordering::Relaxed),
        failures: 0,
    })?;
    workload::remove_groups::<Aarch64>(sh)?;
    bench::run(&bench::Team { n, barrier: &team.barrier }, 0);
    Ok(())
}

/// A secondary CPU's part, in step with the boot CPU.
pub fn secondary(me: usize) {
    let team: &Team = TEAM.wait();
    let Some(sh) = workload::shared::<Aarch64>() else {
        team.failures[me].set("no shared state at the start of the workload");
        return;
    };
    cpu::irq_enable();
    on_every_cpu(team, sh, me);
    bench::run(&bench::Team { n: team.n, barrier: &team.barrier }, me);
}

/// The workload every CPU runs at the same time, between barriers, with
/// its timer handler allocating; then it waits for an interrupt-context
/// allocation and stops them (the baseline before the first barrier and
/// the checks after the last count on none in flight).
fn on_every_cpu(team: &Team, sh: &'static Shared<Hw>, me: usize) {
    team.barrier.wait(); // start together, after the boot CPU's baseline
    irq::start_allocating();
    if let Err(e) = workload::run::<Aarch64>(sh, me) {
        team.failures[me].set(e);
    }
    // The timer must have allocated on this CPU at least once.
    let deadline = cpu::ticks() + IRQ_WAIT_S * cpu::ticks_per_second();
    while cpu::this().irq_allocs.load(Ordering::Relaxed) == 0 {
        if cpu::ticks() > deadline {
            team.failures[me].set("no allocation in interrupt context within 10 s");
            break;
        }
        cpu::wait_for_interrupt();
    }
    irq::stop_allocating();
    team.barrier.wait(); // all done
}
