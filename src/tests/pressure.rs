use std::boxed::Box;
use std::string::ToString;
use std::thread;
use std::vec::Vec;

use crate::platform::OsPages;
use crate::{Cgroup, Error, Kmem, Pressure, PressureState, Thresholds};

fn kmem() -> &'static Kmem<OsPages> {
    Box::leak(Box::new(Kmem::new(OsPages::new())))
}

fn t(min: usize, pressure: usize, max: usize) -> Thresholds {
    Thresholds { min, pressure, max }
}

/// A group `g` of a fresh allocator and its `tcp` resource with
/// `thresholds`.
fn tcp_of_fresh_group(thresholds: Thresholds) -> (Cgroup<'static, Kmem<OsPages>>, Pressure<'static, Kmem<OsPages>>) {
    let g = kmem().root().create_child("g").unwrap();
    let p = g.pressure("tcp", thresholds).unwrap();
    (g, p)
}

#[test]
fn thresholds_are_validated_against_order_and_the_parent() {
    let k = kmem();
    let parent = k.root().create_child("container").unwrap();
    let child = parent.create_child("app").unwrap();
    assert_eq!(parent.pressure("tcp", t(10, 5, 20)).err(), Some(Error::BadThresholds));
    assert_eq!(parent.pressure("tcp", t(10, 20, 15)).err(), Some(Error::BadThresholds));
    assert_eq!(parent.pressure("", t(1, 2, 3)).err(), Some(Error::NameEmpty));
    let p = parent.pressure("tcp", t(1000, 2000, 3000)).unwrap();
    assert_eq!(child.pressure("tcp", t(100, 200, 3001)).err(), Some(Error::AboveParentMax { parent_max: 3000 }));
    let c = child.pressure("tcp", t(100, 200, 3000)).unwrap();
    assert_eq!(c.thresholds(), t(100, 200, 3000));
    // Re-tuning returns the same resource.
    let c2 = child.pressure("tcp", t(50, 100, 150)).unwrap();
    assert_eq!(c.thresholds(), t(50, 100, 150));
    assert_eq!(c2.charge(100), PressureState::Normal);
    assert_eq!(c.usage(), 100);
    assert_eq!(child.pressure("tcp", t(10, 20, 30)).err(), Some(Error::LimitBelowUsage { usage: 100 }));
    c.uncharge(100).unwrap();
    // Any number of resources (there were 4 slots), each its own.
    let many: std::vec::Vec<_> =
        (0..40).map(|i| child.pressure(&std::format!("r{i}"), t(0, 10, 20)).unwrap()).collect();
    for (i, r) in many.iter().enumerate() {
        assert_ne!(r.charge(i % 21), PressureState::Refused);
        assert_eq!(r.usage(), i % 21, "resource {i}");
    }
    let stat = child.stat().to_string();
    assert!(stat.contains("pressure r0 usage 0") && stat.contains("pressure r6 usage 6"), "{stat}");
    assert!(stat.contains("pressure_more 33\n"), "tcp and the first 7 of 40 shown: {stat}");
    drop(p);
}

/// A resource opened in a child before its parent's still charges the
/// parent: the parent gets the resource, unlimited, with the child's, and
/// tuning it later binds the child (found by a review: the child's
/// resource kept a null parent and charged no ancestor).
#[test]
fn a_childs_resource_made_first_still_charges_its_parent() {
    let k = kmem();
    let parent = k.root().create_child("container").unwrap();
    let child = parent.create_child("app").unwrap();
    let grandchild = child.create_child("worker").unwrap();
    let w = grandchild.pressure("tcp", t(100, 200, 1000)).unwrap();
    assert_eq!(w.charge(300), PressureState::UnderPressure);
    let p = parent.pressure("tcp", t(400, 500, 600)).unwrap();
    assert_eq!(p.usage(), 300, "the parent counts what its descendant charged before");
    assert_eq!(child.pressure("tcp", Thresholds::UNLIMITED).err(), Some(Error::AboveParentMax { parent_max: 600 }));
    let c = child.pressure("tcp", t(0, 550, 600)).unwrap();
    assert_eq!(c.usage(), 300);
    assert_eq!(parent.pressure("tcp", t(0, 0, 299)).err(), Some(Error::LimitBelowUsage { usage: 300 }));
    assert_eq!(w.charge(301), PressureState::Refused, "the parent's max binds: 300 + 301 > 600");
    assert_eq!(w.charge(250), PressureState::UnderPressure);
    assert_eq!((w.usage(), c.usage(), p.usage()), (550, 550, 550));
    let root = k.root().pressure("tcp", Thresholds::UNLIMITED).unwrap();
    assert_eq!(root.usage(), 550, "the root got the resource too");
    assert_eq!(p.uncharge(1).err(), Some(Error::UnchargeAboveUsage { usage: 0 }));
    w.uncharge(550).unwrap();
    assert_eq!((w.usage(), c.usage(), p.usage(), root.usage()), (0, 0, 0, 0));
    assert!(parent.stat().to_string().contains("pressure tcp usage 0 min 400 pressure 500 max 600"));
}

/// A charge the child refuses moves nothing above it: charges go in from
/// the top level down, and the parent's peak and pressure state used to
/// take the charge before the child refused it.
#[test]
fn a_charge_refused_below_leaves_the_parents_peak_and_state() {
    let k = kmem();
    let parent = k.root().create_child("container").unwrap();
    let child = parent.create_child("app").unwrap();
    let p = parent.pressure("tcp", t(0, 50, 1000)).unwrap();
    let c = child.pressure("tcp", t(0, 100, 100)).unwrap();
    assert_eq!(c.charge(200), PressureState::Refused);
    assert_eq!((p.usage(), p.peak(), p.entered(), p.state()), (0, 0, 0, PressureState::Normal));
    assert_eq!((c.refused(), p.refused()), (1, 0));
    assert_eq!(c.charge(60), PressureState::UnderPressure, "the parent's pressure threshold is 50");
    assert_eq!((p.peak(), p.entered(), c.peak(), c.entered()), (60, 1, 60, 0));
    c.uncharge(60).unwrap();
}

/// What a group's resource still holds when the group goes (removed, its
/// handles dropped) leaves its ancestors' resources: no handle could give
/// it back any more, and the parent stayed full and under pressure for
/// good (found by a review).
#[test]
fn a_freed_groups_pressure_bytes_leave_its_ancestors() {
    let k = kmem();
    let p = k.root().create_child("p").unwrap();
    let pp = p.pressure("tcp", t(0, 50, 100)).unwrap();
    let c = p.create_child("c").unwrap();
    let w = c.pressure("tcp", t(0, 100, 100)).unwrap();
    assert_eq!(w.charge(100), PressureState::UnderPressure);
    assert_eq!(pp.charge(1), PressureState::Refused);
    drop(w);
    c.remove().unwrap();
    assert_eq!(pp.usage(), 100, "a removed group's handle-less bytes stay until the group goes");
    drop(c);
    k.shrink();
    assert_eq!(pp.usage(), 0, "the freed group's bytes stayed in its parent");
    assert_eq!(pp.charge(1), PressureState::Normal);
    assert_eq!(pp.state(), PressureState::Normal);
    pp.uncharge(1).unwrap();
    let root = k.root().pressure("tcp", Thresholds::UNLIMITED).unwrap();
    assert_eq!(root.usage(), 0);
}

/// A parent's resource gives back only what was charged through it: a
/// parent that could give back its child's bytes left the child's own
/// uncharge to wrap the parent's usage, and every later charge on both
/// was refused (found by a review helper).
#[test]
fn a_parent_cannot_uncharge_its_childs_bytes() {
    let k = kmem();
    let p = k.root().create_child("p").unwrap();
    let c = p.create_child("c").unwrap();
    let pp = p.pressure("tcp", t(0, 1000, 10_000)).unwrap();
    let cp = c.pressure("tcp", t(0, 1000, 10_000)).unwrap();
    assert_eq!(cp.charge(100), PressureState::Normal);
    assert_eq!(pp.uncharge(100), Err(Error::UnchargeAboveUsage { usage: 0 }), "the child's bytes");
    assert_eq!((pp.usage(), cp.usage()), (100, 100), "a refused uncharge changes nothing");
    assert_eq!(pp.charge(30), PressureState::Normal);
    assert_eq!(pp.uncharge(31), Err(Error::UnchargeAboveUsage { usage: 30 }));
    pp.uncharge(30).unwrap();
    cp.uncharge(100).unwrap();
    assert_eq!((pp.usage(), cp.usage()), (0, 0));
    assert_eq!(cp.charge(1), PressureState::Normal, "nothing wrapped");
    assert_eq!(pp.charge(1), PressureState::Normal);
    cp.uncharge(1).unwrap();
    pp.uncharge(1).unwrap();
}

/// Extreme uncharges: zero is accepted and changes nothing; `usize::MAX`
/// and one byte more than was charged are refused with what was.
#[test]
fn uncharge_extremes_change_nothing() {
    let (_g, p) = tcp_of_fresh_group(t(0, 100, 200));
    p.uncharge(0).unwrap();
    assert_eq!(p.uncharge(usize::MAX), Err(Error::UnchargeAboveUsage { usage: 0 }));
    assert_eq!(p.charge(10), PressureState::Normal);
    assert_eq!(p.uncharge(11), Err(Error::UnchargeAboveUsage { usage: 10 }));
    assert_eq!(p.uncharge(usize::MAX), Err(Error::UnchargeAboveUsage { usage: 10 }));
    assert_eq!(p.usage(), 10);
    p.uncharge(10).unwrap();
    assert_eq!(p.usage(), 0);
}

#[test]
fn state_transitions_at_each_boundary() {
    let (g, p) = tcp_of_fresh_group(t(100, 200, 300));
    assert_eq!(p.charge(100), PressureState::Normal);
    assert_eq!(p.charge(100), PressureState::Normal, "exactly at `pressure` is not above it");
    assert_eq!(p.charge(1), PressureState::UnderPressure);
    assert_eq!(p.entered(), 1);
    p.uncharge(50).unwrap();
    assert_eq!(p.state(), PressureState::UnderPressure, "stays under pressure until below min");
    assert_eq!(p.charge(0), PressureState::UnderPressure);
    p.uncharge(52).unwrap();
    assert_eq!(p.usage(), 99);
    assert_eq!(p.state(), PressureState::Normal, "below min leaves pressure");
    assert_eq!(p.charge(201), PressureState::UnderPressure);
    assert_eq!(p.entered(), 2);
    assert_eq!(p.usage(), 300, "exactly max is allowed");
    assert_eq!(p.charge(1), PressureState::Refused);
    assert_eq!(p.usage(), 300, "a refused charge charges nothing");
    assert_eq!(p.refused(), 1);
    p.uncharge(300).unwrap();
    let st = g.stat().to_string();
    assert!(st.contains("pressure tcp usage 0 min 100 pressure 200 max 300"), "{st}");
}

#[test]
fn charges_propagate_and_the_parent_max_binds() {
    let k = kmem();
    let parent = k.root().create_child("host").unwrap();
    let a = parent.create_child("a").unwrap();
    let b = parent.create_child("b").unwrap();
    let pp = parent.pressure("tcp", t(0, 500, 1000)).unwrap();
    let pa = a.pressure("tcp", t(0, 800, 1000)).unwrap();
    let pb = b.pressure("tcp", t(0, 800, 1000)).unwrap();
    assert_eq!(pa.charge(600), PressureState::UnderPressure, "the parent crossed its pressure mark");
    assert_eq!(pp.usage(), 600);
    assert_eq!(pb.charge(500), PressureState::Refused, "the parent's max binds b");
    assert_eq!((pb.usage(), pp.usage()), (0, 600));
    assert_eq!(pp.refused(), 1);
    assert_eq!(pb.charge(400), PressureState::UnderPressure);
    pa.uncharge(600).unwrap();
    pb.uncharge(400).unwrap();
    assert_eq!(pp.usage(), 0);
    assert!(pp.peak() <= 1 << 16, "the peak of accepted charges passed max");
    assert_eq!(pp.state(), PressureState::Normal);
}

#[test]
fn concurrent_charge_and_uncharge_leave_zero() {
    let k = kmem();
    let parent = k.root().create_child("p").unwrap();
    let pp = parent.pressure("buf", t(1 << 10, 1 << 14, 1 << 16)).unwrap();
    let kids: Vec<_> = (0..4).map(|i| parent.create_child(&std::format!("k{i}")).unwrap()).collect();
    let hs: Vec<_> = kids
        .into_iter()
        .map(|kid| {
            thread::spawn(move || {
                let r = kid.pressure("buf", t(0, 1 << 12, 1 << 15)).unwrap();
                let mut held = 0;
                for i in 0..50_000 {
                    if i % 3 == 2 {
                        r.uncharge(held).unwrap();
                        held = 0;
                    } else if r.charge(64 + i % 200) != PressureState::Refused {
                        held += 64 + i % 200;
                    }
                    assert!(r.usage() <= (1 << 15) + 4 * 264, "max overshot beyond in-flight charges");
                }
                r.uncharge(held).unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(pp.usage(), 0);
    assert_eq!(pp.state(), PressureState::Normal);
}

/// Issue 13, item 7: an uncharge of more than a resource holds used to
/// panic in debug builds and wrap usage to 2^64 - n in release, after which
/// every charge was refused.
#[test]
fn uncharge_above_usage_is_refused_and_changes_nothing() {
    let k = kmem();
    let parent = k.root().create_child("p").unwrap();
    let child = parent.create_child("c").unwrap();
    let pp = parent.pressure("tcp", t(0, 1000, 2000)).unwrap();
    let pc = child.pressure("tcp", t(0, 1000, 2000)).unwrap();
    assert_eq!(pp.charge(30), PressureState::Normal);
    assert_eq!(pc.charge(10), PressureState::Normal);
    assert_eq!(pc.uncharge(40).err(), Some(Error::UnchargeAboveUsage { usage: 10 }));
    assert_eq!((pc.usage(), pp.usage()), (10, 40), "a refused uncharge changes no level");
    assert_eq!(pc.charge(1), PressureState::Normal, "charges still work");
    pc.uncharge(11).unwrap();
    assert_eq!(pc.uncharge(1).err(), Some(Error::UnchargeAboveUsage { usage: 0 }));
    assert_eq!(pp.uncharge(usize::MAX).err(), Some(Error::UnchargeAboveUsage { usage: 30 }));
    pp.uncharge(30).unwrap();
    assert_eq!((pc.usage(), pp.usage()), (0, 0));
}

/// A refused re-tune (max below usage) leaves all three thresholds as
/// they were (it used to write `min` and `pressure` before the check).
#[test]
fn refused_retune_changes_no_threshold() {
    let (g, p) = tcp_of_fresh_group(t(100, 200, 300));
    assert_eq!(p.charge(250), PressureState::UnderPressure);
    assert_eq!(g.pressure("tcp", t(1, 2, 3)).err(), Some(Error::LimitBelowUsage { usage: 250 }));
    assert_eq!(p.thresholds(), t(100, 200, 300));
    p.uncharge(250).unwrap();
}

/// Extreme amounts: nothing charged, 0 uncharges; the largest charge is
/// refused at any max; more than held is refused at every level.
#[test]
fn pressure_extreme_amounts() {
    let (g, p) = tcp_of_fresh_group(t(0, 10, 100));
    p.uncharge(0).unwrap();
    assert_eq!(p.charge(0), PressureState::Normal);
    assert_eq!(p.charge(usize::MAX), PressureState::Refused);
    assert_eq!(p.usage(), 0);
    let u = g.pressure("udp", Thresholds::UNLIMITED).unwrap();
    assert_ne!(u.charge(usize::MAX), PressureState::Refused, "an unlimited resource takes everything once");
    assert_eq!(u.charge(1), PressureState::Refused, "and refuses the byte that would wrap");
    assert_eq!(u.usage(), usize::MAX);
    u.uncharge(usize::MAX).unwrap();
    assert_eq!(u.uncharge(1).err(), Some(Error::UnchargeAboveUsage { usage: 0 }));
}

/// Two threads opening the same new resource at once get one resource:
/// the loser of the race frees the node it made, and both handles charge
/// the same counter.
#[test]
fn the_same_new_resource_opened_from_two_threads_is_one() {
    for round in 0..scaled_rounds() {
        let (g, _p) = tcp_of_fresh_group(t(0, 1000, 2000));
        let g = std::sync::Arc::new(g);
        let name = std::format!("race{round}");
        let handles: std::vec::Vec<_> = (0..2)
            .map(|_| {
                let (g, name) = (g.clone(), name.clone());
                std::thread::spawn(move || {
                    let r = g.pressure(&name, t(0, 100, 200)).unwrap();
                    assert_ne!(r.charge(10), PressureState::Refused);
                    r
                })
            })
            .collect();
        let rs: std::vec::Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!((rs[0].usage(), rs[1].usage()), (20, 20), "one counter for both");
        let stat = g.stat().to_string();
        assert_eq!(stat.matches(&std::format!("pressure {name} ")).count(), 1, "{stat}");
    }
}

fn scaled_rounds() -> usize {
    crate::testutil::scaled(50, 10)
}

/// The nodes an ancestor got for its descendants' resources go with the
/// last descendant (unlinked under the tree lock, freed once no reader
/// walks the list) while another thread reads the ancestors' stat rows,
/// which walk those lists: under Miri, a freed node read would be
/// reported. The root's own resource stays.
#[test]
fn nodes_made_for_descendants_go_while_stats_read_them() {
    let k = kmem();
    let mid = k.root().create_child("mid").unwrap();
    let own = k.root().pressure("own", t(0, 1000, 2000)).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let text = std::format!("{}{}", k.root().stat(), mid.stat());
                assert!(text.contains("pressure own "), "{text}");
            }
        });
        for i in 0..scaled_rounds() * 4 {
            let g = mid.create_child("job").unwrap();
            let p = g.pressure(&std::format!("n{i}"), t(0, 10, 20)).unwrap();
            let o = g.pressure("own", t(0, 10, 20)).unwrap();
            p.charge(5);
            o.charge(5);
            g.remove().unwrap();
            drop((p, o, g));
            // Frees the job's group (and the nodes made for it).
            k.shrink();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    // The last shrinks may have found the reader in a walk (its groups
    // then wait in the limbo): one with no reader frees them.
    k.shrink();
    assert_eq!(own.usage(), 0);
    let text = std::format!("{}{}", k.root().stat(), mid.stat());
    assert!(!text.contains("pressure n"), "{text}");
    assert_eq!(mid.stat().to_string().matches("pressure ").count(), 0, "{}", mid.stat());
}
