//! Run with: `cargo run --release --example no_std_region`
//!
//! The smallest use of kmemcg without an OS: a `Region` over a static
//! array, `spin` locks, and the `NoCpus` platform (one context: one CPU
//! slot whose magazines serve it, taken with a compare-and-swap; a kernel with
//! several CPUs supplies their ids instead).
//! Everything above `main` uses `core` and kmemcg only — it is what a
//! `#![no_std]` kernel or unikernel writes (`kernel-demo/` boots exactly
//! this under QEMU). `main` links `std` only to print what happened.
//!
//! In a `no_std` crate, depend on kmemcg with `default-features = false`
//! and install the allocator with `#[global_allocator]`; here it is used
//! through the `GlobalAlloc` and `Allocator` interfaces directly, so the
//! program's own allocations stay on the system allocator.

#![no_std]

extern crate std;

use core::alloc::{GlobalAlloc, Layout};
use core::mem::MaybeUninit;
use core::ptr::addr_of_mut;

use kmemcg::{CacheFlags, Error, Kmem, NoCpus, PageSource, Region};

/// The heap: 4 MiB of static memory (a kernel would use its boot memory map).
const HEAP_BYTES: usize = 4 << 20;
static mut HEAP: [MaybeUninit<u8>; HEAP_BYTES] = [MaybeUninit::uninit(); HEAP_BYTES];

/// The allocator: spin locks, no per-CPU slots, pages from `HEAP`.
static KMEM: Kmem<Region, spin::Mutex<()>, NoCpus> = Kmem::with_platform(Region::new(), NoCpus::new());

/// A typed object, as a kernel would keep inodes or sockets.
struct Inode {
    ino: u64,
    size: u64,
}

/// Hands the static array to the allocator; call once at boot.
fn init() {
    // SAFETY: `init` runs once, before anything else touches `HEAP`, and
    // the region keeps the only reference for the rest of the program.
    let heap: &'static mut [MaybeUninit<u8>] = unsafe { &mut *addr_of_mut!(HEAP) };
    KMEM.source().add(heap, 0).expect("the heap is one region");
}

/// What the run saw, for `main` to print.
struct Report {
    pages_reserved: usize,
    blocks: usize,
    inodes: u64,
    tenant_usage: usize,
    tenant_error: Option<Error>,
    pages_after: usize,
}

/// The allocator at work, with `core` only.
fn run() -> Report {
    let pages_reserved = KMEM.source().stats().pages_reserved;

    // Raw blocks through `GlobalAlloc`, written and checked.
    let layout = Layout::from_size_align(256, 16).expect("a valid layout");
    let mut blocks = [core::ptr::null_mut::<u8>(); 64];
    for (i, b) in blocks.iter_mut().enumerate() {
        // SAFETY: a non-zero-sized layout.
        *b = unsafe { KMEM.alloc(layout) };
        assert!(!b.is_null());
        // SAFETY: a fresh 256-byte block.
        unsafe { b.write_bytes(i as u8, layout.size()) };
    }
    for (i, &b) in blocks.iter().enumerate() {
        // SAFETY: live blocks of 256 bytes, freed once with their layout.
        unsafe {
            assert_eq!(*b.add(255), i as u8);
            KMEM.dealloc(b, layout);
        }
    }

    // A typed cache: objects of one type, freed when their box drops.
    let inodes = KMEM.create_cache::<Inode>("inode", CacheFlags::NONE).expect("a cache");
    let mut sum = 0;
    for ino in 0..1000u64 {
        let inode = inodes.alloc(Inode { ino, size: ino * 512 }).expect("memory for an inode");
        sum += inode.ino + inode.size / 512;
    }

    // A group with a 64 KiB cap: objects of an accounted cache allocated
    // while it is entered are charged to it, and fail cleanly at the cap
    // with a typed error naming the group; nothing else is affected.
    let tenant = KMEM.root().create_child("tenant").expect("a group");
    tenant.set_max(64 << 10).expect("a valid limit");
    let pages = KMEM.create_cache::<[u8; 1024]>("buffer", CacheFlags::ACCOUNT).expect("a cache");
    let mut held = [const { None }; 128];
    let mut tenant_error = None;
    {
        let _in = tenant.enter();
        for slot in held.iter_mut() {
            match pages.alloc([7; 1024]) {
                Ok(b) => *slot = Some(b),
                Err(e) => {
                    tenant_error = Some(e);
                    break;
                }
            }
        }
    }
    let tenant_usage = tenant.stat().usage;
    assert!(held.iter().flatten().all(|b| b[1023] == 7));
    drop(held);
    tenant.remove().expect("no handles left");
    KMEM.shrink();
    Report {
        pages_reserved,
        blocks: blocks.len(),
        inodes: sum,
        tenant_usage,
        tenant_error,
        pages_after: KMEM.source().stats().pages_in_use,
    }
}

fn main() {
    init();
    let r = run();
    std::println!("heap: {} KiB static array, {} pages managed", HEAP_BYTES >> 10, r.pages_reserved);
    std::println!("GlobalAlloc: {} blocks of 256 bytes written, checked and freed", r.blocks);
    std::println!("typed cache 'inode': 1000 objects, checksum {}", r.inodes);
    std::println!(
        "group 'tenant' (max 64 KiB): held {} KiB, then the next allocation failed with: {}",
        r.tenant_usage >> 10,
        r.tenant_error.map_or_else(|| std::string::String::from("(no failure!)"), |e| std::format!("{e}")),
    );
    std::println!("after removing the group and shrinking: {} pages in use", r.pages_after);
}
