//! Links the bare-metal build with `linker.ld`: the vector table at
//! address 0, code in SSRAM1, data, stack and heap in SSRAM2.

include!("../common/build_link.rs");

fn main() {
    link_with_script(&[]);
}
