//! The SMP self-test's driver, the same on every kernel: the boot CPU sets
//! up [`workload`](crate::workload) and takes the baseline, every CPU runs
//! its part at once with its timer allocating in interrupt context, then
//! the boot CPU collects the failures, checks the accounting, prints the
//! per-CPU lines ([`report`](crate::report)) and removes the groups. The
//! kernel says how its CPUs keep in step and how its timer works
//! ([`Smp`]); starting the CPUs and the bench stay the kernel's.

use crate::MAX_CPUS;
use crate::arch::Arch;
use crate::failure::Failure;
use crate::kprintln;
use crate::report::{self, IrqCounts};
use crate::workload::{self, Shared};

/// What the driver needs from a kernel besides [`Arch`].
pub trait Smp: Arch {
    /// Boot CPU: lets the others start their part (they wait in
    /// [`wait_start`](Smp::wait_start)).
    fn start_others();
    /// Any other CPU: waits until the boot CPU starts the run.
    fn wait_start();
    /// Any other CPU: its part is done.
    fn done();
    /// Boot CPU, its own part done: waits until all `n` CPUs are done.
    fn wait_done(n: usize);
    /// This CPU: its timer handler starts allocating in interrupt
    /// context, interrupts on.
    fn irq_work_start();
    /// This CPU: waits (bounded) until its handler has allocated, then
    /// stops it; nothing of the handler's is allocated on return.
    fn irq_work_stop() -> Result<(), &'static str>;
    /// CPU `i`'s interrupt-context allocations.
    fn irq_counts(i: usize) -> IrqCounts;
}

/// Each CPU's first failure in the run.
static FAILURES: [Failure; MAX_CPUS] = [const { Failure::new() }; MAX_CPUS];

/// The boot CPU's part of the run on `n` CPUs (the others call
/// [`other_cpu`]).
pub fn boot_cpu<S: Smp>(n: usize) -> Result<(), &'static str> {
    let sh = workload::setup::<S>(n)?;
    let kmem = S::heap();
    kmem.shrink();
    let root_before = kmem.root().usage();
    let pages_before = kmem.stats().source.pages_in_use;
    kprintln!(S; "workload: starting on {n} CPUs");
    S::start_others();
    cpu_part::<S>(sh, 0);
    S::wait_done(n);
    let mut failed = None;
    for (i, f) in FAILURES[..n].iter().enumerate() {
        if let Some(e) = f.get() {
            kprintln!(S; "workload: index {i} failed: {e}");
            failed = failed.or(Some(e));
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    workload::check_accounting::<S>(sh, root_before, pages_before)?;
    report::cpu_lines::<S>(n, S::irq_counts)?;
    workload::remove_groups::<S>(sh)
}

/// CPU `me`'s part of the run (any CPU but the boot CPU).
pub fn other_cpu<S: Smp>(me: usize) {
    S::wait_start();
    match workload::shared::<S>() {
        Some(sh) => cpu_part::<S>(sh, me),
        None => FAILURES[me % MAX_CPUS].set("no shared state at the start of the workload"),
    }
    S::done();
}

/// The workload on this CPU with its timer allocating; records a failure.
fn cpu_part<S: Smp>(sh: &'static Shared<S::Cpu>, me: usize) {
    S::irq_work_start();
    let r = workload::run::<S>(sh, me);
    let w = S::irq_work_stop();
    if let Err(e) = r.and(w) {
        FAILURES[me % MAX_CPUS].set(e);
    }
}
