//! The CPU → node map of the NUMA boots and [`NumaCpu`], the platform of
//! their two-node heap: a kernel's `kmemcg::Cpu` whose `node_of` and
//! `nodes` answer from the map.
//!
//! The boot CPU fills the map ([`set_cpu_node`]) from the firmware
//! (x86_64: the ACPI SRAT; aarch64: the device tree's `numa-node-id`)
//! before it starts the other CPUs; `numa::start` then sets the node
//! count, before any CPU allocates from the heap that uses [`NumaCpu`].

use core::marker::PhantomData;
use core::sync::atomic::{AtomicUsize, Ordering};

pub use crate::MAX_CPUS;

/// Nodes the test runs on.
pub const NODES: usize = 2;

/// `node_of` for each CPU index (`kmemcg::Cpu` contract 4: fixed before
/// the CPU first allocates from the two-node heap).
static CPU_NODE: [AtomicUsize; MAX_CPUS] = [const { AtomicUsize::new(0) }; MAX_CPUS];
/// Nodes in use, for `kmemcg::Cpu::nodes`; 1 until the map is set.
static NODES_IN_USE: AtomicUsize = AtomicUsize::new(1);

/// The node of CPU `cpu` (for [`NumaCpu`]'s `node_of`).
#[inline(always)]
pub fn cpu_node(cpu: usize) -> usize {
    // Relaxed: written once by the boot CPU before any CPU allocates from
    // the two-node heap (and before the others start, which orders the
    // write).
    CPU_NODE.get(cpu).map_or(0, |n| n.load(Ordering::Relaxed))
}

/// Nodes in use (for [`NumaCpu`]'s `nodes`).
#[inline(always)]
pub fn nodes() -> usize {
    // Relaxed: as for `cpu_node`.
    NODES_IN_USE.load(Ordering::Relaxed)
}

/// Records that CPU index `cpu` is on `node` (boot CPU, before the CPU
/// starts and before `numa::start`).
pub fn set_cpu_node(cpu: usize, node: usize) -> Result<(), &'static str> {
    if cpu >= MAX_CPUS || node >= NODES {
        return Err("a CPU or node number out of range");
    }
    CPU_NODE[cpu].store(node, Ordering::Relaxed);
    Ok(())
}

/// From now on [`nodes`] answers [`NODES`] (boot CPU, once the map is
/// complete, before any CPU allocates from the two-node heap).
pub fn set_nodes_in_use() {
    NODES_IN_USE.store(NODES, Ordering::Relaxed);
}

/// The kernel's `C` with nodes: the node of each CPU from the map.
pub struct NumaCpu<C>(PhantomData<C>);

// SAFETY: (1), (2), (3), (5) and (6) as for `C`, whose functions these
// are (`BARRIER` included). (4) `cpu_node` returns a node below `NODES`
// (2, below `kmemcg::MAX_NODES`; `set_cpu_node` refuses others), set by
// the boot CPU before any CPU allocates from the heap that uses
// `NumaCpu` and never changed; `nodes` is `NODES` from then on.
unsafe impl<C: kmemcg::Cpu> kmemcg::Cpu for NumaCpu<C> {
    const BARRIER: bool = C::BARRIER;

    #[inline(always)]
    fn id() -> usize {
        C::id()
    }

    #[inline(always)]
    fn irq_save() -> usize {
        C::irq_save()
    }

    #[inline(always)]
    unsafe fn irq_restore(saved: usize) {
        // SAFETY: forwarded from the caller.
        unsafe { C::irq_restore(saved) }
    }

    #[inline(always)]
    fn in_interrupt() -> bool {
        C::in_interrupt()
    }

    #[inline(always)]
    fn now_ms() -> Option<u64> {
        C::now_ms()
    }

    #[inline(always)]
    fn node_of(cpu: usize) -> usize {
        cpu_node(cpu)
    }

    #[inline(always)]
    fn nodes() -> usize {
        nodes()
    }

    #[inline(always)]
    fn barrier_all() {
        C::barrier_all()
    }

    #[inline(always)]
    fn throttle(ns: u64) {
        C::throttle(ns)
    }
}
