//! What a user's own loom test looks like with kmemcg linked in: the whole
//! public API builds under `--cfg loom` (with and without default
//! features), on loom's atomics and `LoomRawMutex`, so the allocator's
//! synchronisation is part of what loom checks.
//!
//! Run it with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test loom_user`.
//!
//! Under loom, `Kmem::new` is not `const`: build the allocator inside the
//! model (a `static` cannot hold it) and drop it at the end of the model
//! (loom runs the model many times). A `Kmem<OsPages>` builds on loom's
//! default 32 KiB model stack (under loom it keeps its tree and size
//! classes on the heap: 4.7 KB inline); a `Region` is 16 KB under loom,
//! so the `Region` model builds it on a model thread with a larger stack.
//!
//! Loom's default builder (`loom::model`, at most 1,000 branches per
//! execution) is enough to build a `Kmem`, create a group, allocate and
//! free from two threads (entering the group or not), check the group
//! empty (`assert_empty`), remove it and drop it all: the two
//! `a_plain_loom_model_*` models are written that way. A whole-allocator
//! `shrink` takes about 1,900 more branches (it walks every cache's slots,
//! depots and node lists), so the two models that call it raise
//! `max_branches`.
//!
//! Four models: the std defaults, `Kmem<OsPages>` with the `Threads`
//! platform (threads `enter` a group and take per-thread slots, so loom
//! checks the magazines' slot handshake too), twice on loom's default
//! builder and once with a shrink and a removal; and a `Region` of memory
//! the test owns with the `NoCpus` platform, the default without `std`
//! (one current group for every thread: charge groups through their
//! allocator handles and typed caches' `alloc_in`, not `enter`).

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use std::alloc::{GlobalAlloc, Layout};

use kmemcg::allocator_api2::alloc::Allocator;
use kmemcg::{CacheFlags, DefaultRawMutex, Kmem, NoCpus, OsPages, Region};

/// A node of the user's data structure, kept in an accounted typed cache.
struct Node {
    key: u64,
    value: [u64; 3],
}

/// Loom's model builder with room for a shrink and a group's removal
/// (more than the default 1,000 branches: see the module docs).
fn model(body: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.max_branches = 20_000;
    model.check(body);
}

/// The model thread's stack for a `Region`-based `Kmem` (18.5 KB under
/// loom), in loom's unit (words).
const REGION_STACK: usize = (256 << 10) / size_of::<usize>();

/// The std defaults: `Kmem` is `Kmem<OsPages>` on the `Threads` platform.
/// Two threads enter a group, allocate and free; once they are joined,
/// `shrink` empties their slots' magazines and the group's usage is zero.
#[test]
fn two_threads_enter_a_group_on_os_pages_and_give_everything_back() {
    model(|| {
        // One allocator per execution of the model, dropped at its end
        // (under loom, a dropped `OsPages` unmaps what it mapped).
        let kmem_ptr = Box::into_raw(Box::new(Kmem::new(OsPages::new())));
        // SAFETY: freed only at the end, once nothing refers to it.
        let kmem: &'static Kmem = unsafe { &*kmem_ptr };
        let tenant = Arc::new(kmem.root().create_child("tenant").unwrap());
        // The first allocation of a size in a group sets up its caches:
        // done once here, before the threads, it keeps their part of the
        // model (what loom explores) to the allocation paths they share.
        {
            let _in = tenant.enter();
            let layout = Layout::new::<[u64; 4]>();
            // SAFETY: freed at once with its layout.
            unsafe { kmem.deallocate(kmem.allocate(layout).unwrap().cast(), layout) };
        }
        let workers: Vec<_> = (0..2u64)
            .map(|i| {
                let tenant = tenant.clone();
                thread::spawn(move || {
                    let _in = tenant.enter();
                    let layout = Layout::new::<[u64; 4]>();
                    let block = kmem.allocate(layout).unwrap().cast::<u64>();
                    // SAFETY: a fresh block of 4 u64s, ours until freed.
                    unsafe {
                        block.write(i);
                        assert_eq!(block.read(), i);
                        kmem.deallocate(block.cast(), layout);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert!(tenant.usage() > 0, "the tenant was charged for its slabs");
        kmem.shrink();
        assert_eq!(tenant.usage(), 0, "a charge stayed after every object was freed");
        tenant.remove().unwrap();
        drop(tenant);
        // SAFETY: the workers are joined and every handle is gone: nothing
        // refers to the allocator any more.
        drop(unsafe { Box::from_raw(kmem_ptr) });
    });
}

/// `Region` and `NoCpus` (the defaults without `std`): two threads
/// allocate from an accounted typed cache and through the group's
/// allocator.
#[test]
fn two_threads_allocate_in_a_group_and_give_everything_back() {
    type K = Kmem<Region, DefaultRawMutex, NoCpus>;
    model(|| thread::Builder::new().stack_size(REGION_STACK).spawn(region_model).unwrap().join().unwrap());
    fn region_model() {
        // One allocator and one arena per execution of the model,
        // given back at its end (loom runs the model many times).
        let mem = Box::into_raw(Box::<[u8]>::new_uninit_slice(128 << 10));
        let kmem = Box::into_raw(Box::new(K::with_platform(Region::new(), NoCpus::new())));
        // SAFETY: freed only at the end, once nothing refers to it.
        let (mem, kmem): (&'static mut _, &'static K) = unsafe { (&mut *mem, &*kmem) };
        let (mem_ptr, kmem_ptr) = (mem as *mut [std::mem::MaybeUninit<u8>], kmem as *const K);
        kmem.source().add(mem, 0).unwrap();
        let tenant = Arc::new(kmem.root().create_child("tenant").unwrap());
        let nodes = Arc::new(kmem.create_cache::<Node>("node", CacheFlags::ACCOUNT).unwrap());
        // Unlike the model above, the threads make the first allocations
        // of their sizes in the group: loom explores the caches' set-up
        // racing too.
        let workers: Vec<_> = (0..2u64)
            .map(|i| {
                let (tenant, nodes) = (tenant.clone(), nodes.clone());
                thread::spawn(move || {
                    let n = nodes.alloc_in(&tenant, Node { key: i, value: [i; 3] }).unwrap();
                    let layout = std::alloc::Layout::new::<[u8; 100]>();
                    let block = tenant.allocator().allocate(layout).unwrap();
                    assert_eq!((n.key, n.value), (i, [i; 3]));
                    // SAFETY: allocated just above with `layout`.
                    unsafe { tenant.allocator().deallocate(block.cast(), layout) };
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert!(tenant.usage() > 0, "the tenant was charged for its slabs");
        kmem.shrink();
        assert_eq!(tenant.usage(), 0, "a charge stayed after every object was freed");
        tenant.remove().unwrap();
        drop((tenant, nodes));
        // SAFETY: the workers are joined and every handle dropped:
        // nothing refers to the allocator or its arena any more.
        unsafe {
            drop(Box::from_raw(kmem_ptr.cast_mut()));
            drop(Box::from_raw(mem_ptr));
        }
    }
}

/// A model written as loom's docs write one, on loom's default builder
/// (`loom::model`: its default `max_branches` of 1,000 and its default
/// model stack): build a `Kmem` inside it, allocate and free a few blocks
/// from two threads, drop it.
#[test]
fn a_plain_loom_model_builds_a_kmem_and_allocates_from_two_threads() {
    loom::model(|| {
        let k: Arc<Kmem> = Arc::new(Kmem::new(OsPages::new()));
        let workers: Vec<_> = (0..2u64)
            .map(|i| {
                let k = k.clone();
                thread::spawn(move || {
                    let (small, large) = (Layout::new::<[u64; 4]>(), Layout::new::<[u64; 12]>());
                    // SAFETY: non-zero-size layouts; each block is checked
                    // for null and freed below with its own layout.
                    unsafe {
                        let blocks = [k.alloc(small), k.alloc(small), k.alloc(large)].map(|p| p.cast::<u64>());
                        for (n, &p) in blocks.iter().enumerate() {
                            assert!(!p.is_null());
                            p.write(i * 10 + n as u64);
                        }
                        for (n, &p) in blocks.iter().enumerate() {
                            assert_eq!(p.read(), i * 10 + n as u64);
                        }
                        k.dealloc(blocks[0].cast(), small);
                        k.dealloc(blocks[1].cast(), small);
                        k.dealloc(blocks[2].cast(), large);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        drop(k);
    });
}

/// The same on loom's default builder, with a group: threads `enter` it
/// and allocate; then the group is checked empty and removed, as a test's
/// teardown does (a group borrows its allocator, so the `Kmem` is boxed
/// and freed by hand at the end, once every handle is gone).
/// `assert_empty` needs little stack when it passes, so it fits loom's
/// default model stack.
#[test]
fn a_plain_loom_model_with_a_group_entered_from_two_threads() {
    loom::model(|| {
        let kmem_ptr = Box::into_raw(Box::new(Kmem::new(OsPages::new())));
        // SAFETY: freed only at the end, once nothing refers to it.
        let k: &'static Kmem = unsafe { &*kmem_ptr };
        let tenant = Arc::new(k.root().create_child("tenant").unwrap());
        let workers: Vec<_> = (0..2u64)
            .map(|i| {
                let tenant = tenant.clone();
                thread::spawn(move || {
                    let _in = tenant.enter();
                    let layout = Layout::new::<[u64; 4]>();
                    // SAFETY: a non-zero-size layout; freed below with it.
                    unsafe {
                        let p = k.alloc(layout).cast::<u64>();
                        assert!(!p.is_null());
                        p.write(i);
                        assert_eq!(p.read(), i);
                        k.dealloc(p.cast(), layout);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert!(tenant.usage() > 0, "the tenant was charged for its slabs");
        tenant.assert_empty();
        tenant.remove().unwrap();
        drop(tenant);
        // SAFETY: the workers are joined and the group's handle dropped:
        // nothing refers to the allocator any more.
        drop(unsafe { Box::from_raw(kmem_ptr) });
    });
}
