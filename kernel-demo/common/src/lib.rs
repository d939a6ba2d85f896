//! The architecture-free part of the demo kernels (`kernel-demo`,
//! `kernel-demo/aarch64`) and, for the tutorial heap tests, the Cortex-M
//! program (`kernel-demo/cortex-m`).
//!
//! A kernel implements [`Arch`] (one line of console output, its heaps)
//! and calls the tests here; what stays in the kernel is its architecture:
//! boot, interrupts, timer, serial, the memory map, starting the other
//! CPUs. The modules, none of which imports a sibling but [`arch`]:
//!
//! - [`arch`]: the [`Arch`] trait, the heap types, [`kprintln!`];
//! - `cpu` (x86_64 and aarch64): [`Hw`](cpu::Hw), the kernels'
//!   `kmemcg::Cpu`, over each architecture's per-CPU block
//!   ([`CpuBlock`](cpu::CpuBlock));
//! - [`tutorial_heap`]: a tutorial kernel's heap tests and the `heap=KIB`
//!   parser;
//! - [`icount`]: the `icount` mode's arithmetic and report lines;
//! - [`small_heap`]: the `heap=KIB` mode, those tests in a small heap;
//! - [`node_map`]: the CPU → node map of the NUMA boots and
//!   [`NumaCpu`](node_map::NumaCpu), their heap's platform;
//! - `numa` (targets with 64-bit atomics): the `numa` and `numa-icount`
//!   modes, the two-node test and its counts;
//! - [`selftest`]: the single-CPU checks (collections, a typed cache, two
//!   limited groups);
//! - [`workload`]: the SMP workload every CPU runs at once, and the
//!   accounting checks after it;
//! - [`smp`]: the driver of that run on every CPU ([`Smp`](smp::Smp): how
//!   a kernel keeps its CPUs in step and runs its timer), with
//!   [`failure`] for each CPU's first failure;
//! - [`report`]: the per-CPU lines after it (magazines, interrupt-context
//!   allocations);
//! - [`lock`] ([`IrqLock`](lock::IrqLock)) and [`publish`]
//!   ([`Published`](publish::Published)): the SMP tests' shared state.
//!
//! Built for the host (`cargo build --workspace`), it compiles to the same
//! `no_std` library, which nothing there uses.

#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc, missing_docs)]

extern crate alloc;

pub mod arch;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub mod cpu;
pub mod failure;
pub mod icount;
pub mod lock;
pub mod node_map;
#[cfg(target_has_atomic = "64")]
pub mod numa;
pub mod publish;
pub mod report;
pub mod selftest;
pub mod small_heap;
pub mod smp;
pub mod tutorial_heap;
pub mod workload;

pub use arch::{Arch, Heap, NumaHeap};

/// CPUs the kernels run at most (each has a block and a stack per CPU;
/// below `kmemcg::MAX_CPUS`).
pub const MAX_CPUS: usize = 8;
