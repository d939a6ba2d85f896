//! Pressure resources: random thresholds, charges and uncharges across a
//! small tree; a refused charge charges nothing, no level passes its max,
//! and everything uncharged leaves zero; an uncharge of more than a
//! resource holds is refused and changes nothing.

#![no_main]

use std::mem::MaybeUninit;

use arbitrary::Arbitrary;
use kmemcg::{Kmem, Pressure, PressureState, Region, Thresholds};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Tune {
        g: u8,
        min: u16,
        pressure: u16,
        max: u16,
    },
    Charge {
        g: u8,
        bytes: u16,
    },
    Uncharge {
        idx: u8,
    },
    /// More than the resource holds: refused, nothing changes.
    OverUncharge {
        g: u8,
        extra: u16,
    },
}

fuzz_target!(|ops: Vec<Op>| {
    // One allocator per process; each input's groups are removed at its end.
    static K: std::sync::OnceLock<&'static Kmem<Region>> = std::sync::OnceLock::new();
    let k = *K.get_or_init(|| {
        let k: &'static Kmem<Region> = Box::leak(Box::new(Kmem::new(Region::new())));
        k.source().add(Box::leak(vec![MaybeUninit::uninit(); 1 << 20].into_boxed_slice()), 0).unwrap();
        k
    });
    let host = k.root().create_child("host").unwrap();
    let kids = [host.create_child("a").unwrap(), host.create_child("b").unwrap()];
    let hp = host.pressure("tcp", Thresholds { min: 1000, pressure: 5000, max: 20000 }).unwrap();
    let res: Vec<Pressure<'static, Kmem<Region>>> =
        kids.iter().map(|g| g.pressure("tcp", Thresholds { min: 0, pressure: 10000, max: 20000 }).unwrap()).collect();
    let mut held: Vec<(usize, usize)> = Vec::new();
    for op in ops {
        match op {
            Op::Tune { g, min, pressure, max } => {
                let t = Thresholds { min: min as usize, pressure: pressure as usize, max: max as usize };
                let _ = kids[g as usize % 2].pressure("tcp", t);
            }
            Op::Charge { g, bytes } => {
                let i = g as usize % 2;
                let before = (res[i].usage(), hp.usage());
                match res[i].charge(bytes as usize) {
                    PressureState::Refused => assert_eq!((res[i].usage(), hp.usage()), before, "refused but charged"),
                    _ => held.push((i, bytes as usize)),
                }
                assert!(hp.usage() <= hp.thresholds().max, "host max passed");
                assert!(res[i].usage() <= res[i].thresholds().max, "kid max passed");
            }
            Op::Uncharge { idx } if !held.is_empty() => {
                let (i, b) = held.swap_remove(idx as usize % held.len());
                res[i].uncharge(b).unwrap();
            }
            Op::OverUncharge { g, extra } => {
                let i = g as usize % 2;
                let before = (res[i].usage(), hp.usage());
                assert!(res[i].uncharge(before.0 + 1 + extra as usize).is_err(), "over-uncharge accepted");
                assert_eq!((res[i].usage(), hp.usage()), before, "refused uncharge changed usage");
            }
            _ => {}
        }
    }
    for (i, b) in held {
        res[i].uncharge(b).unwrap();
    }
    assert_eq!(hp.usage(), 0);
    assert!(res.iter().all(|r| r.usage() == 0));
    drop(res);
    drop(hp);
    for g in &kids {
        g.remove().unwrap();
    }
    host.remove().unwrap();
});
