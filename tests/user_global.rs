//! What a user's test binary does with kmemcg installed as its global
//! allocator, with the README's own line: collections, two threads, a
//! magazine spill, a group entered, charged and removed. It runs in
//! `cargo test`, and under Miri with Stacked and with Tree Borrows in
//! `.ci/run` (`cargo +nightly miri test --test user_global`), which is how
//! a user Miri-checks their own code with kmemcg linked in.

use std::collections::HashMap;

use kmemcg::{Kmem, OsPages};

#[global_allocator]
static KMEM: Kmem = Kmem::new(OsPages::new());

/// Objects per thread: enough to spill a magazine (64 rounds) natively,
/// fewer under Miri, whose magazines hold 4.
const N: usize = if cfg!(miri) { 6 } else { 2000 };

#[test]
fn collections_threads_and_a_group() {
    let tenant = KMEM.root().create_child("tenant").unwrap();
    tenant.set_max(64 << 20).unwrap();
    let handles: Vec<_> = (0..2)
        .map(|t| {
            std::thread::spawn(move || {
                let mut map: HashMap<String, Vec<u64>> = HashMap::new();
                for i in 0..N {
                    map.insert(format!("key-{t}-{i}"), vec![i as u64; 3]);
                }
                let boxes: Vec<Box<[u8; 48]>> = (0..N).map(|i| Box::new([i as u8; 48])).collect();
                let sum: usize = boxes.iter().map(|b| b[0] as usize).sum();
                drop(boxes);
                (map.len(), sum)
            })
        })
        .collect();
    for h in handles {
        let (len, _) = h.join().unwrap();
        assert_eq!(len, N);
    }
    {
        let _in = tenant.enter();
        let v: Vec<u32> = (0..1000).collect();
        assert!(tenant.usage() > 0, "the vector is charged to the tenant");
        assert_eq!(v.iter().sum::<u32>(), 499_500);
    }
    KMEM.shrink();
    assert_eq!(tenant.usage(), 0);
    tenant.remove().unwrap();
    assert_eq!(KMEM.stats().bad_frees, 0);
}
