// The demo kernels' build scripts' one job, shared by them with
// `include!` (a build script cannot depend on a crate of the workspace
// that is built for the target): `kernel-demo/build.rs`,
// `kernel-demo/aarch64/build.rs`, `kernel-demo/cortex-m/build.rs`.

/// Links the bare-metal build's binaries with the package's `linker.ld`
/// and the `extra` linker arguments; the host build (a plain program that
/// prints how to build the kernel) gets nothing.
fn link_with_script(extra: &[&str]) {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=linker.ld");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("none") {
        return;
    }
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-link-arg-bins=-T{dir}/linker.ld");
    for arg in extra {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
}
