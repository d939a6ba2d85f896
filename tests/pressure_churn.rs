//! Groups made and removed one after another, each opening a pressure
//! resource of a name of its own: a resource's ancestors hold it too
//! (made unlimited for it), and the root lived forever, so before the
//! root kept a node for every name ever opened; a 1 MiB region ran out
//! after 7,780 groups, and opening got slower with every name (found by
//! a review). Now a node made for descendants goes with the last of
//! them; one opened on its own group stays with that group.

use std::mem::MaybeUninit;

use kmemcg::{Kmem, PAGE_SIZE, Region, Thresholds};

#[test]
fn unique_pressure_names_on_short_lived_groups() {
    let k: &'static Kmem<Region> = Box::leak(Box::new(Kmem::new(Region::new())));
    k.source().add(Box::leak(vec![MaybeUninit::uninit(); 256 * PAGE_SIZE].into_boxed_slice()), 0).unwrap();
    let t = Thresholds { min: 0, pressure: 10, max: 100 };
    let mid = k.root().create_child("mid").unwrap();
    // One the root opened itself: it stays.
    let kept = k.root().pressure("kept", Thresholds { min: 0, pressure: 1000, max: 10_000 }).unwrap();
    let mut pages_then = 0;
    for i in 0..20_000 {
        if i == 100 {
            k.shrink();
            pages_then = k.stats().source.pages_in_use;
        }
        let g = mid.create_child("job").unwrap();
        let p = g.pressure(&format!("sock{i}"), t).unwrap();
        let shared = g.pressure("kept", t).unwrap();
        p.charge(10);
        shared.charge(5);
        if i % 1000 == 0 {
            // The root shows the job's names while the job lives.
            let st = k.root().stat().to_string();
            assert!(st.contains(&format!("pressure sock{i} ")), "{st}");
        }
        g.remove().unwrap();
        drop((p, shared, g));
    }
    // The last job's group goes with the next reclamation of groups.
    k.shrink();
    let pages_now = k.stats().source.pages_in_use;
    assert!(pages_now <= pages_then, "{pages_then} pages in use after 100 jobs, {pages_now} after 20,000");
    assert_eq!(kept.usage(), 0, "a freed group's charges leave its ancestors' resources");
    // What is left: the root's own resource, and nothing of the jobs'.
    let st = k.root().stat().to_string();
    assert!(st.contains("pressure kept "), "{st}");
    assert!(!st.contains("sock"), "{st}");
    assert!(!mid.stat().to_string().contains("pressure"), "{}", mid.stat());
    // A name opened again after its nodes went works as new.
    let g = mid.create_child("job").unwrap();
    let p = g.pressure("sock7", t).unwrap();
    assert_eq!(p.charge(10), kmemcg::PressureState::Normal);
    g.remove().unwrap();
}
