//! What a user's own loom test looks like with kmemcg linked in: the whole
//! public API builds under `--cfg loom` (with and without default
//! features), on loom's atomics and `LoomRawMutex`, so the allocator's
//! synchronisation is part of what loom checks.
//!
//! Run it with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test loom_user`.
//!
//! Under loom, `Kmem::new` is not `const`: build the allocator inside the
//! model (a `static` cannot hold it), on a model thread with a large stack
//! (a `Kmem` is tens of kilobytes), over a `Region` of memory the test
//! owns; raise loom's `max_branches` (setting up and shrinking an
//! allocator takes more steps than its default). Without `std` the default
//! platform is `NoCpus`, one current group
//! for every thread: charge groups through their allocator handles and
//! typed caches' `alloc_in`, not `enter`.

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use kmemcg::allocator_api2::alloc::Allocator;
use kmemcg::{CacheFlags, Kmem, Region};

/// A node of the user's data structure, kept in an accounted typed cache.
struct Node {
    key: u64,
    value: [u64; 3],
}

/// The model thread's stack: room for a `Kmem`.
const STACK: usize = 16 << 20;

#[test]
fn two_threads_allocate_in_a_group_and_give_everything_back() {
    let mut model = loom::model::Builder::new();
    // Building a `Kmem`, a group and a cache, and shrinking at the end,
    // take many steps on one thread: more than loom's default of 1,000.
    model.max_branches = 100_000;
    model.check(|| {
        thread::Builder::new()
            .stack_size(STACK)
            .spawn(|| {
                // One allocator and one arena per execution of the model,
                // given back at its end (loom runs the model many times).
                let mem = Box::into_raw(Box::<[u8]>::new_uninit_slice(128 << 10));
                let kmem = Box::into_raw(Box::new(Kmem::<Region>::new(Region::new())));
                // SAFETY: freed only at the end, once nothing refers to it.
                let (mem, kmem): (&'static mut _, &'static Kmem<Region>) = unsafe { (&mut *mem, &*kmem) };
                let (mem_ptr, kmem_ptr) = (mem as *mut [std::mem::MaybeUninit<u8>], kmem as *const Kmem<Region>);
                kmem.source().add(mem, 0).unwrap();
                let tenant = Arc::new(kmem.root().create_child("tenant").unwrap());
                let nodes = Arc::new(kmem.create_cache::<Node>("node", CacheFlags::ACCOUNT).unwrap());
                let workers: Vec<_> = (0..2u64)
                    .map(|i| {
                        let (tenant, nodes) = (tenant.clone(), nodes.clone());
                        thread::Builder::new()
                            .stack_size(STACK)
                            .spawn(move || {
                                let n = nodes.alloc_in(&tenant, Node { key: i, value: [i; 3] }).unwrap();
                                let layout = std::alloc::Layout::new::<[u8; 100]>();
                                let block = tenant.allocator().allocate(layout).unwrap();
                                assert_eq!((n.key, n.value), (i, [i; 3]));
                                // SAFETY: allocated just above with `layout`.
                                unsafe { tenant.allocator().deallocate(block.cast(), layout) };
                            })
                            .unwrap()
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
            })
            .unwrap()
            .join()
            .unwrap();
    });
}
