//! An accounted typed cache whose object fills its slab: its charged
//! cache (which serves the groups' objects) needs an owner word per object
//! in slabs of the same order, and there was no room for one, so every
//! allocation in a group failed with `OutOfMemory` while the root's
//! succeeded (found by a review). Now such a cache takes the next order
//! that has room, or is refused with `BadLayout` at creation where the
//! allocator's slab order cap allows none.

use kmemcg::{CacheFlags, Detection, Error, Kmem, OsPages};

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
fn where_the_cap_allows_no_room_creation_is_refused() {
    // Detection off whatever `KMEMCG_DEBUG` says: its padding would make
    // the object need a larger slab than the cap anyway (which a capped
    // cache then gets, exact).
    let k: &'static Kmem =
        Box::leak(Box::new(Kmem::new(OsPages::new()).with_max_slab_order(3).with_detection(Detection::OFF)));
    assert_eq!(k.create_cache::<[u8; 32704]>("capped", CacheFlags::ACCOUNT).err(), Some(Error::BadLayout));
    // Unaccounted, it fits.
    let c = k.create_cache::<[u8; 32704]>("capped-plain", CacheFlags::NONE).unwrap();
    drop(c.alloc([0; 32704]).unwrap());
}
