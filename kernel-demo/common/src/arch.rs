//! What a kernel gives the shared part: the [`Arch`] trait, its heap
//! types, and [`kprintln!`](crate::kprintln) over its console.

use core::fmt;

use kmemcg::{IrqSpinLock, Kmem, PerCpu, Region};

use crate::node_map::NumaCpu;

/// A kernel heap: kmemcg over `Region`s of RAM, with interrupt-masking
/// locks and one magazine slot per CPU of `C`.
pub type Heap<C> = Kmem<Region<IrqSpinLock<C>>, IrqSpinLock<C>, PerCpu<C>>;

/// The NUMA boots' heap: each node's RAM as that node's regions, the same
/// locks, and a platform that knows each CPU's node ([`NumaCpu`]).
pub type NumaHeap<C> = Kmem<Region<IrqSpinLock<C>>, IrqSpinLock<C>, PerCpu<NumaCpu<C>>>;

/// One architecture's kernel, as the shared tests see it.
pub trait Arch: 'static {
    /// The kernel's `kmemcg::Cpu`: CPU index, interrupt masking,
    /// interrupt context.
    type Cpu: kmemcg::Cpu;

    /// Writes one line (`args` and a newline) to the console, whole,
    /// against other CPUs; allocates nothing, callable from any CPU.
    fn print_line(args: fmt::Arguments<'_>);

    /// The kernel heap (the `#[global_allocator]`).
    fn heap() -> &'static Heap<Self::Cpu>;

    /// The NUMA boots' heap (`KMEM_NUMA`), beside the global one.
    fn numa_heap() -> &'static NumaHeap<Self::Cpu>;

    /// A counter that advances at [`ticks_per_second`](Arch::ticks_per_second)
    /// on every CPU (x86_64: the TSC; aarch64: `CNTVCT_EL0`).
    fn ticks() -> u64;

    /// The counter's frequency, Hz (not 0).
    fn ticks_per_second() -> u64;
}

/// `us` microseconds in ticks of `A`'s counter.
pub fn us_to_ticks<A: Arch>(us: u64) -> u64 {
    (u128::from(us) * u128::from(A::ticks_per_second()) / 1_000_000) as u64
}

/// `ticks` of `A`'s counter in microseconds.
pub fn ticks_to_us<A: Arch>(ticks: u64) -> u64 {
    (u128::from(ticks) * 1_000_000 / u128::from(A::ticks_per_second().max(1))) as u64
}

/// `println!` to the console of the kernel `A`: `kprintln!(A; "...", ...)`.
#[macro_export]
macro_rules! kprintln {
    ($arch:ty; $($arg:tt)*) => {
        <$arch as $crate::Arch>::print_line(format_args!($($arg)*))
    };
}
