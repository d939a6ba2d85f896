//! Links the bare-metal build with `linker.ld`, at a fixed address.

include!("common/build_link.rs");

fn main() {
    // x86_64-unknown-none links static PIEs by default; the boot stub uses
    // absolute 32-bit addresses and the image is loaded where it is linked,
    // so link a plain (non-PIE) executable: no dynamic relocations to apply.
    link_with_script(&["--no-pie"]);
}
