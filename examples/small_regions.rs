//! Run with: `cargo run --release --example small_regions`
//!
//! What a `Kmem` over one small `Region` gives (issue 29): for regions of
//! 16 KiB to 1 MiB, page aligned as a kernel maps its heap, the slab order
//! cap the allocator chose at its first use, the bytes the region and the
//! allocator keep for themselves, the largest size up to which every
//! allocation succeeds in a fresh allocator, and how many 64-byte boxes
//! fit; then a tutorial kernel's heap tests in 64 KiB and 100 KiB. The
//! table is the one in the README's *Small memory*; `tests/small_regions.rs`
//! checks it.

#[path = "support/small.rs"]
mod small;

fn kib(bytes: usize) -> String {
    if bytes.is_multiple_of(1024) { format!("{} KiB", bytes / 1024) } else { format!("{bytes} B") }
}

fn main() {
    println!(
        "| region | slab order cap | region metadata | allocator metadata | every allocation up to | 64-byte boxes |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for bytes in small::SIZES {
        let r = small::measure(bytes);
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            kib(r.bytes),
            r.max_order,
            kib(r.region_meta),
            kib(r.kmem_meta),
            kib(r.largest),
            r.boxes64
        );
    }
    for bytes in [64 << 10, 100 << 10] {
        small::tutorial(small::small_kmem(bytes, 0));
        println!("tutorial heap tests in {}: passed", kib(bytes));
    }
}
