//! The self-test on this kernel: the shared single-CPU checks
//! (`kernel_common::selftest`) on the boot CPU, then the shared SMP run
//! (`kernel_common::smp`: the workload on every CPU at once, the checks
//! and per-CPU lines), then the timing comparison (`bench`).

use kernel_common::{selftest, smp};

use super::arch::Aarch64;
use super::bench;
use super::cpu;
use super::sync::{self, Team};

type Test = Result<(), &'static str>;

/// The boot CPU's part: the single-CPU checks, the SMP run with the
/// others, then the timing comparison.
pub fn run(n: usize) -> Test {
    let team = sync::make_team(n);
    selftest::run::<Aarch64>()?;
    cpu::irq_enable();
    smp::boot_cpu::<Aarch64>(n)?;
    bench::run(&bench_team(team), 0);
    Ok(())
}

/// A secondary CPU's part, in step with the boot CPU.
pub fn secondary(me: usize) {
    let team = sync::team();
    cpu::irq_enable();
    smp::other_cpu::<Aarch64>(me);
    bench::run(&bench_team(team), me);
}

/// The bench's view of the team.
fn bench_team(team: &Team) -> bench::Team<'_> {
    bench::Team { n: team.n, barrier: &team.barrier }
}
