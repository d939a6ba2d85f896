//! kernel-demo: a minimal bare-metal x86_64 SMP kernel whose heap is
//! kmemcg.
//!
//! It boots under `qemu-system-x86_64 -smp 4 -kernel`, hands the RAM of
//! the multiboot memory map to a [`kmemcg::Region`], installs a
//! [`kmemcg::Kmem`] with the per-CPU platform ([`kmemcg::PerCpu`]) as
//! `#[global_allocator]`, checks `alloc` collections, a typed cache and two
//! limited groups on the bootstrap CPU, then starts the other CPUs (INIT
//! and STARTUP IPIs, a real-mode trampoline), runs a workload on all of
//! them at once with a local APIC timer allocating in interrupt context,
//! checks the accounting and the per-CPU counts, times the allocator,
//! prints the results on COM1, and exits QEMU through the
//! `isa-debug-exit` device (status 33: pass, 35: fail). Run it with `bash
//! kernel-demo/run-qemu.sh` from the workspace root; `README.md` lists
//! the files.
//!
//! # Boot path
//!
//! The image carries a Multiboot v1 header and a 32-bit entry stub
//! (`kernel/boot.rs`, `global_asm!`): zero `.bss`, identity-map the first
//! 4 GiB with 2 MiB pages, enable PAE, long mode and paging, load a 64-bit
//! GDT, far-return to 64-bit code, call `kmain(magic, info)`.
//!
//! `linker.ld` links the image at 1 MiB; `build.rs` passes it (and
//! `--no-pie`, since `x86_64-unknown-none` links static PIEs by default and
//! the stub uses absolute 32-bit addresses) to this crate's binary only.
//!
//! # Why objcopy
//!
//! QEMU's multiboot loader refuses ELF64 images. Rather than the a.out
//! kludge (header fields giving load, end and entry addresses, which only
//! work if the file's layout mirrors memory byte for byte), `run-qemu.sh`
//! converts the linked ELF64 with `objcopy -I elf64-x86-64 -O elf32-i386`:
//! the program headers and the entry point (all below 4 GiB) carry over,
//! the loader loads the segments and zero-fills `.bss`, and the 64-bit code
//! inside is untouched bytes.
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
    println!("kernel-demo is a bare-metal x86_64 kernel; the host build does nothing.");
    println!("Build it:  cargo build -p kernel-demo --release --target x86_64-unknown-none");
    println!("Boot it:   bash kernel-demo/run-qemu.sh   (from the workspace root)");
}
