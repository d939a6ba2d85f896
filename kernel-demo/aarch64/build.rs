//! Links the bare-metal build with `linker.ld`, at a fixed address.

include!("../common/build_link.rs");

fn main() {
    // aarch64-unknown-none links static, non-PIE executables already; the
    // script places the image where QEMU loads it (see linker.ld).
    link_with_script(&[]);
}
