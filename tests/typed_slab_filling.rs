//! An accounted typed cache whose object fills its slab: its charged
//! cache (which serves the groups' objects) needs an owner word per object
//! in slabs of the same order, and there was no room for one, so every
//! allocation in a group failed with `OutOfMemory` while the root's
//! succeeded (found by a review). Now such a cache takes the next order
//! that has room, past the allocator's slab order cap if need be, as any
//! type too large for a capped slab does (a later review found it refused
//! with `BadLayout` under a cap while every larger type was accepted).

use kmemcg::{CacheFlags, Detection, Kmem, OsPages};

#[test]
fn an_accounted_cache_of_a_slab_filling_type_serves_groups() {
    let k: &'static Kmem = Box::leak(Box::new(Kmem::new(OsPages::new())));
    let g = k.root().create_child("g").unwrap();
    // A 32 KiB slab less its 64-byte header: one object per slab.
    let c = k.create_cache::<[u8; 32704]>("fills-slab", CacheFlags::ACCOUNT).unwrap();
    let root_box = c.alloc([1; 32704]).expect("the root's object");
    let b = c.alloc_in(&g, [2; 32704]).expect("a group's object");
    assert!(g.usage() >= 32704);
    assert_eq!((root_box[0], b[32703]), (1, 2));
    drop((root_box, b));
    drop(c);
    k.shrink();
    assert_eq!(g.usage(), 0);
    // The same size unaccounted keeps its one-object slabs, and a type
    // that leaves room for the word keeps its order too.
    drop(k.create_cache::<[u8; 32704]>("plain", CacheFlags::NONE).unwrap());
    let c = k.create_cache::<[u8; 16352]>("two-a-slab", CacheFlags::ACCOUNT).unwrap();
    drop(c.alloc_in(&g, [3; 16352]).unwrap());
}

#[test]
fn under_a_cap_a_slab_filling_type_is_served_as_larger_types_are() {
    // Detection off whatever `KMEMCG_DEBUG` says: its padding would make
    // the object need a larger slab than the cap anyway.
    let k: &'static Kmem =
        Box::leak(Box::new(Kmem::new(OsPages::new()).with_max_slab_order(3).with_detection(Detection::OFF)));
    let g = k.root().create_child("g").unwrap();
    // Fills a slab of the cap's order exactly, so the owner word needs the
    // next one: accepted, as the larger type beside it always was.
    let c = k.create_cache::<[u8; 32704]>("capped", CacheFlags::ACCOUNT).unwrap();
    let larger = k.create_cache::<[u8; 32705]>("larger", CacheFlags::ACCOUNT).unwrap();
    let (a, b) = (c.alloc_in(&g, [4; 32704]).unwrap(), larger.alloc_in(&g, [5; 32705]).unwrap());
    assert!(g.usage() >= 32704 + 32705);
    assert_eq!((a[32703], b[32704]), (4, 5));
    drop((a, b));
    drop((c, larger));
    // The same at the smallest cap (the README's heap that stays small):
    // a page less its header fills an order-0 slab.
    let small: &'static Kmem =
        Box::leak(Box::new(Kmem::new(OsPages::new()).with_max_slab_order(0).with_detection(Detection::OFF)));
    let g0 = small.root().create_child("g0").unwrap();
    let c = small.create_cache::<[u8; 4032]>("page", CacheFlags::ACCOUNT).unwrap();
    drop(c.alloc_in(&g0, [6; 4032]).unwrap());
    // Unaccounted, it fits the capped slab as before.
    let plain = k.create_cache::<[u8; 32704]>("capped-plain", CacheFlags::NONE).unwrap();
    drop(plain.alloc([0; 32704]).unwrap());
    drop((c, plain));
    k.shrink();
    small.shrink();
    assert_eq!((g.usage(), g0.usage()), (0, 0));
}
