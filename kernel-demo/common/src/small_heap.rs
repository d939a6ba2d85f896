//! The `heap=KIB` mode: the kernel heap (per-CPU platform, on the one
//! CPU) got only that many KiB of RAM (the kernel's `memory.rs`), and
//! runs a tutorial kernel's heap tests over it ([`crate::tutorial_heap`]),
//! then checks that a shrink gives every page back. `bash
//! kernel-demo/run-qemu.sh ARCH heap=100` boots it and greps the PASS
//! line.

use crate::arch::{Arch, Heap};
use crate::kprintln;
use crate::tutorial_heap;

/// Runs the suite in the `bytes` the heap got; prints each step, the
/// heap's use, and on a failure what the allocator was short of.
pub fn run<A: Arch>(bytes: usize) -> Result<(), &'static str> {
    let kmem = A::heap();
    let kib = bytes >> 10;
    kprintln!(A;
        "heap suite: {kib} KiB heap, {} free pages, slab order cap {}",
        kmem.source().free_pages_on(0),
        kmem.max_slab_order()
    );
    if let Err(e) = tutorial_heap::run(|step| kprintln!(A; "heap suite: {step} ok")) {
        kprintln!(A; "heap suite: {e}");
        report_oom::<A>(kmem);
        return Err("the heap suite failed");
    }
    let in_use = kmem.stats().source.pages_in_use;
    kmem.shrink();
    let after = kmem.stats();
    kprintln!(A;
        "heap suite: {in_use} pages in use at the end (empty slabs, magazines), {} after a shrink, {} bad frees",
        after.source.pages_in_use,
        after.bad_frees
    );
    if after.source.pages_in_use != 0 || after.bad_frees != 0 {
        return Err("the heap suite left pages in use after a shrink, or saw bad frees");
    }
    kprintln!(A; "kmemcg heap suite in {kib} KiB: PASS");
    Ok(())
}

/// Prints `Kmem::last_oom()` (it allocates nothing).
fn report_oom<A: Arch>(kmem: &Heap<A::Cpu>) {
    match kmem.last_oom() {
        Some(r) => kprintln!(A; "heap suite: {r}"),
        None => kprintln!(A; "heap suite: no shortage recorded"),
    }
}
