//! Links the bare-metal build with `linker.ld`, at a fixed address.

use std::env;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=linker.ld");
    // The host build is a plain program that prints how to build the kernel.
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("none") {
        return;
    }
    let dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    // aarch64-unknown-none links static, non-PIE executables already; the
    // script places the image where QEMU loads it (see linker.ld).
    println!("cargo:rustc-link-arg-bins=-T{dir}/linker.ld");
}
