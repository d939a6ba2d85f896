//! A reusable barrier for the CPUs of the self-test, and the team of
//! CPUs it keeps in step.

use core::sync::atomic::{AtomicUsize, Ordering};

use kernel_common::publish::Published;

use super::cpu;

/// Spins before a waiting CPU sleeps until its next interrupt (the timer
/// wakes it within a tick); spinning vCPUs slow the others under TCG.
const SPINS_BEFORE_WFI: usize = 2000;

/// A barrier for a fixed number of CPUs, reusable (generation count).
pub struct Barrier {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl Barrier {
    /// A barrier for `n` CPUs.
    pub const fn new(n: usize) -> Self {
        Barrier { n, arrived: AtomicUsize::new(0), generation: AtomicUsize::new(0) }
    }

    /// Waits until all `n` CPUs have called `wait` (for this generation).
    /// Everything each CPU did before is visible to all after. Call with
    /// IRQs enabled and the timer running (the wait may sleep in `wfi`).
    pub fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.store(generation + 1, Ordering::Release);
            return;
        }
        let mut spins = 0;
        while self.generation.load(Ordering::Acquire) == generation {
            if spins < SPINS_BEFORE_WFI {
                spins += 1;
                core::hint::spin_loop();
            } else {
                cpu::wait_for_interrupt();
            }
        }
    }
}

/// The CPUs of the self-test: how many, and the barrier that keeps them
/// in step (the workload's phases, the bench).
pub struct Team {
    /// CPUs taking part.
    pub n: usize,
    /// Their barrier.
    pub barrier: Barrier,
}

/// The [`Team`] of this boot.
static TEAM: Published = Published::new();

/// Makes and publishes the team of `n` CPUs (boot CPU, before the
/// self-test's baseline: it stays allocated).
pub fn make_team(n: usize) -> &'static Team {
    TEAM.publish(Team { n, barrier: Barrier::new(n) })
}

/// The team, once the boot CPU made it.
pub fn team() -> &'static Team {
    TEAM.wait()
}
