//! kernel-demo-cortex-m: a bare-metal Cortex-M4 program for QEMU's
//! `mps2-an386` machine whose heap is kmemcg over a 64 KiB static array.
//!
//! No runtime crate: a vector table and a reset handler of its own
//! (`mcu/boot.rs`: FPU on, `.data` copied, `.bss` zeroed), semihosting for
//! output and the exit status (`mcu/semihosting.rs`), and a
//! [`kmemcg::Cpu`] for one core whose interrupt mask is `PRIMASK` and
//! whose interrupt context is `IPSR != 0` (`mcu/cpu.rs`). The heap is
//! `Kmem<Region<IrqSpinLock<Mcu>>, IrqSpinLock<Mcu>, PerCpu<Mcu>>`, the
//! `#[global_allocator]`; with SysTick allocating and freeing in its
//! handler at 1 kHz, the program runs a tutorial kernel's heap tests,
//! collections (`Vec`, `String`, `BTreeMap`), a typed cache, and a group
//! with a hard limit that an allocation then exceeds cleanly, prints the
//! group's stat, and exits QEMU with status 0 (pass) or 1 through
//! semihosting. Run it with `bash kernel-demo/cortex-m/run-qemu.sh` from
//! the workspace root.
//!
//! # Host builds
//!
//! Built for the host (`cargo build --workspace`), the crate is a stub
//! program that says how to build and run it.

#![cfg_attr(target_os = "none", no_std, no_main)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

#[cfg(target_os = "none")]
extern crate alloc;

#[cfg(target_os = "none")]
mod mcu;

#[cfg(not(target_os = "none"))]
fn main() {
    println!("kernel-demo-cortex-m is a bare-metal Cortex-M4 program; the host build does nothing.");
    println!("Build it:  cargo build -p kernel-demo-cortex-m --release --target thumbv7em-none-eabihf");
    println!("Run it:    bash kernel-demo/cortex-m/run-qemu.sh   (from the workspace root)");
}
