//! The `heap=KIB` mode: the kernel heap (`KMEM`, per-CPU platform, on the
//! one CPU) got only that many KiB of RAM (`memory.rs`), and runs a
//! tutorial kernel's heap tests over it (`common/tutorial_heap.rs`), then
//! checks that a shrink gives every page back. `bash
//! kernel-demo/run-qemu.sh aarch64 heap=100` boots it and greps the PASS
//! line.

use super::serial::kprintln;
use super::tutorial_heap;
use super::{Heap, KMEM};

/// Runs the suite in the `bytes` the heap got; prints each step, the
/// heap's use, and on a failure what the allocator was short of.
pub fn run(bytes: usize) -> Result<(), &'static str> {
    let kib = bytes >> 10;
    kprintln!(
        "heap suite: {kib} KiB heap, {} free pages, slab order cap {}",
        KMEM.source().free_pages_on(0),
        KMEM.max_slab_order()
    );
    if let Err(e) = tutorial_heap::run(|step| kprintln!("heap suite: {step} ok")) {
        kprintln!("heap suite: {e}");
        report_oom(&KMEM);
        return Err("the heap suite failed");
    }
    let in_use = KMEM.stats().source.pages_in_use;
    KMEM.shrink();
    let after = KMEM.stats();
    kprintln!(
        "heap suite: {in_use} pages in use at the end (empty slabs, magazines), {} after a shrink, {} bad frees",
        after.source.pages_in_use,
        after.bad_frees
    );
    if after.source.pages_in_use != 0 || after.bad_frees != 0 {
        return Err("the heap suite left pages in use after a shrink, or saw bad frees");
    }
    kprintln!("kmemcg heap suite in {kib} KiB: PASS");
    Ok(())
}

/// Prints `Kmem::last_oom()` (it allocates nothing).
fn report_oom(kmem: &Heap) {
    match kmem.last_oom() {
        Some(r) => kprintln!("heap suite: {r}"),
        None => kprintln!("heap suite: no shortage recorded"),
    }
}
