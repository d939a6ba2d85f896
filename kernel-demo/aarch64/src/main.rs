//! kernel-demo-aarch64: a minimal SMP aarch64 kernel for QEMU's `virt`
//! machine whose heap is kmemcg with the per-CPU platform.
//!
//! It boots as a Linux arm64 `Image` (so QEMU passes the device tree in
//! `x0`), turns the MMU and caches on on every CPU (identity map, 1 GiB
//! blocks), reads RAM, the GIC, the timer interrupt and the PSCI conduit
//! from the device tree, hands `/memory` minus the image and the device
//! tree to a [`kmemcg::Region`], installs
//! `Kmem<Region<IrqSpinLock<Hw>>, IrqSpinLock<Hw>, PerCpu<Hw>>` as the
//! `#[global_allocator]`, starts the other CPUs with PSCI `CPU_ON`, and
//! runs a workload on every CPU at once with a periodic timer interrupt
//! that allocates in interrupt context. It prints per-CPU magazine
//! statistics on the PL011 UART, times alloc+free pairs, and exits QEMU
//! through semihosting (status 0: pass). Run it with
//! `bash kernel-demo/aarch64/run-qemu.sh` from the workspace root.
//!
//! # Host builds
//!
//! Built for the host (`cargo build --workspace`), the crate is a stub
//! program that says how to build and run the kernel.

#![cfg_attr(target_os = "none", no_std, no_main)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

#[cfg(target_os = "none")]
extern crate alloc;

#[cfg(target_os = "none")]
mod kernel;

#[cfg(not(target_os = "none"))]
fn main() {
    println!("kernel-demo-aarch64 is a bare-metal aarch64 kernel; the host build does nothing.");
    println!("Build it:  cargo build -p kernel-demo-aarch64 --release --target aarch64-unknown-none");
    println!("Boot it:   bash kernel-demo/aarch64/run-qemu.sh   (from the workspace root)");
}
