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
}

/// `println!` to the console of the kernel `A`: `kprintln!(A; "...", ...)`.
#[macro_export]
macro_rules! kprintln {
    ($arch:ty; $($arg:tt)*) => {
        <$arch as $crate::Arch>::print_line(format_args!($($arg)*))
    };
}
