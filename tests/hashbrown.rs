//! The ecosystem's collections take kmemcg's handles: a `hashbrown` map in
//! a limited group fails cleanly at the limit (`try_reserve`), and gives
//! everything back when dropped.

use hashbrown::HashMap;
use kmemcg::{Kmem, OsPages};

#[test]
fn hashbrown_map_in_a_limited_group() {
    let k: &'static Kmem = Box::leak(Box::new(Kmem::new(OsPages::new())));
    let tenant = k.root().create_child("tenant").unwrap();
    tenant.set_max(1 << 20).unwrap();
    {
        let mut map = HashMap::new_in(tenant.allocator());
        for i in 0..1000 {
            map.insert(i, [i; 4]);
        }
        assert!(tenant.usage() > 0, "the map's table is charged to the tenant");
        assert_eq!(map[&999], [999; 4]);
        // Far past the 1 MiB limit: a clean error, the map intact.
        assert!(map.try_reserve(1 << 20).is_err());
        assert_eq!(map.len(), 1000);
        assert!(tenant.usage() <= 1 << 20);
        assert!(tenant.failcnt() > 0);
    }
    k.shrink();
    assert_eq!(tenant.usage(), 0, "usage back to zero after the map is dropped");
    // `&Kmem` is an allocator for them too (charging the current group).
    let mut map = HashMap::new_in(k);
    map.insert("a", 1);
    assert_eq!(map["a"], 1);
}
