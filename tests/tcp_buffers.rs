//! The tcp_buffers example's behaviour, in a short run: the greedy tenant
//! is held at its `max`, the others are unaffected.

#[path = "../examples/support/tcp_demo.rs"]
mod tcp_demo;

use std::sync::atomic::Ordering;
use std::time::Duration;

use kmemcg::{Kmem, OsPages};

#[global_allocator]
static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

#[test]
fn greedy_tenant_is_held_at_its_max_and_others_are_unaffected() {
    let tenants = tcp_demo::tenants(&KMEM);
    tcp_demo::run(&tenants, Duration::from_millis(1500));
    println!("{}", tcp_demo::table(&tenants));
    let (modest, greedy) = tenants.split_at(2);
    let g = &greedy[0];
    assert!(g.tcp.refused() > 0 || g.tcp.entered() > 0, "the greedy tenant never met its limits");
    // The peak counts accepted charges only: `usage` read while another
    // connection's charge is being refused can be briefly higher.
    assert!(g.tcp.peak() <= g.tcp.thresholds().max, "greedy went past its max");
    for t in modest {
        assert_eq!(t.tcp.refused(), 0, "{} was refused", t.name);
        assert!(t.echoed.load(Ordering::Relaxed) > 0, "{} got nothing echoed", t.name);
    }
    for t in &tenants {
        assert_eq!(t.tcp.usage(), 0, "{} left buffers charged", t.name);
    }
}
