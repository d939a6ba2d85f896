//! `min` and `low` protection (issue 18, item 1), seed 002 style: groups
//! with protection next to groups without, under a parent's `max` and
//! under contention; overcommitted protection shared out in proportion.
//!
//! The objects are large (7 pages, charged 8 with their header page, and
//! freed at once), so usages are exact multiples of [`OBJ`].

use core::alloc::{GlobalAlloc, Layout};
use std::vec::Vec;

use super::reclaim::{K, Lru, MB, capped_child, kmem};
use crate::cgroup::Tree;
use crate::platform::{DefaultRawMutex, PAGE_SIZE};
use crate::{Cgroup, Error, GroupId};

/// Bytes an object of the LRU is charged: 7 pages and its header page.
const OBJ: usize = 8 * PAGE_SIZE;
/// The size the LRU allocates.
const SIZE: usize = 7 * PAGE_SIZE;

fn big_lru(k: &'static K) -> &'static Lru {
    Lru::with_size(k, SIZE)
}

/// Objects of group `g` on the LRU.
fn held(lru: &Lru, g: &Cgroup<'static, K>) -> usize {
    let id = g.id();
    lru.entries.lock().unwrap().iter().filter(|(x, _)| *x == id).count()
}

/// Takes `g`'s objects off the LRU (no shrinker can free them now); they
/// are freed by [`unpin`].
fn pin(lru: &Lru, g: &Cgroup<'static, K>) -> Vec<usize> {
    let id = g.id();
    let mut e = lru.entries.lock().unwrap();
    let (mine, rest): (Vec<_>, Vec<_>) = e.drain(..).partition(|(x, _)| *x == id);
    e.extend(rest);
    mine.into_iter().map(|(_, p)| p).collect()
}

/// Allocates up to `n` objects in `g` that no shrinker knows of; returns
/// them (fewer if an allocation failed).
fn pinned(k: &'static K, g: &Cgroup<'static, K>, n: usize) -> Vec<usize> {
    let _in = g.enter();
    let l = Layout::from_size_align(SIZE, 8).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        // SAFETY: a valid layout.
        let p = unsafe { k.alloc(l) };
        if p.is_null() {
            break;
        }
        out.push(p as usize);
    }
    out
}

fn unpin(k: &'static K, objs: Vec<usize>) {
    let l = Layout::from_size_align(SIZE, 8).unwrap();
    for p in objs {
        // SAFETY: allocated with `l`, freed once.
        unsafe { k.dealloc(p as *mut u8, l) };
    }
}

/// A group's effective protection, in objects, in a reclaim for `root`.
fn effective(root: &Cgroup<'static, K>, g: &Cgroup<'static, K>) -> (usize, usize) {
    let _read = g.kmem().tree().read_guard();
    let e = Tree::<DefaultRawMutex>::protection(root.g(), g.g());
    (e.min * PAGE_SIZE / OBJ, e.low * PAGE_SIZE / OBJ)
}

#[test]
fn overcommitted_protection_is_shared_in_proportion_to_the_claims() {
    let k = kmem(16 * MB);
    let root = k.root();
    let p = root.create_child("p").unwrap();
    let (x, y, z) = (p.create_child("x").unwrap(), p.create_child("y").unwrap(), p.create_child("z").unwrap());
    p.set_min(9 * OBJ).unwrap();
    x.set_min(8 * OBJ).unwrap();
    y.set_min(4 * OBJ).unwrap();
    p.set_low(20 * OBJ).unwrap();
    x.set_low(2 * OBJ).unwrap();
    // Usage through the counters themselves: 8, 4 and 5 objects.
    for (g, n) in [(&x, 8), (&y, 4), (&z, 5)] {
        g.g().counter().charge(n * OBJ / PAGE_SIZE);
    }
    // Under contention (the root's reclaim), p keeps its 9: x and y claim
    // 12 together, so each gets 9 * claim / 12; z claims nothing and gets
    // nothing. `low`: p claims all its 17, x its 2 (y and z claim none),
    // which fit.
    assert_eq!(effective(&root, &p), (9, 17));
    assert_eq!(effective(&root, &x), (6, 2));
    assert_eq!(effective(&root, &y), (3, 0));
    assert_eq!(effective(&root, &z), (0, 0));
    // For p's own limits, p is unprotected and its children keep their
    // claims.
    assert_eq!(effective(&p, &p), (0, 0));
    assert_eq!(effective(&p, &x), (8, 2));
    assert_eq!(effective(&p, &y), (4, 0));
    // Claims that fit are kept: with x down to 3 objects, 3 + 4 <= 9.
    x.g().counter().uncharge(5 * OBJ / PAGE_SIZE);
    assert_eq!(effective(&root, &x), (3, 2));
    assert_eq!(effective(&root, &y), (4, 0));
    // A level down, the same: x's children w and v claim 6 and 2 objects,
    // all of x's usage with its own 3; x claims 8 of 11, y 4, so x gets
    // 9 * 8 / 12 = 6 objects, which w and v overcommit (8): w gets
    // 6 * 6 / 8 = 4.5, v 6 * 2 / 8 = 1.5 (36 and 12 pages).
    let (w, v) = (x.create_child("w").unwrap(), x.create_child("v").unwrap());
    w.set_min(100 * OBJ).unwrap();
    v.set_min(100 * OBJ).unwrap();
    w.g().counter().charge(6 * OBJ / PAGE_SIZE);
    v.g().counter().charge(2 * OBJ / PAGE_SIZE);
    let pages = |g: &Cgroup<'static, K>| {
        let _read = k.tree().read_guard();
        Tree::<DefaultRawMutex>::protection(root.g(), g.g()).min * PAGE_SIZE
    };
    assert_eq!(pages(&x), 6 * OBJ);
    assert_eq!(pages(&w), 36 * PAGE_SIZE);
    assert_eq!(pages(&v), 12 * PAGE_SIZE);
    // A parent that claims nothing passes nothing down.
    p.set_min(0).unwrap();
    assert_eq!((pages(&x), pages(&w)), (0, 0));
    for (g, n) in [(&x, 3), (&y, 4), (&z, 5), (&w, 6), (&v, 2)] {
        g.g().counter().uncharge(n * OBJ / PAGE_SIZE);
    }
}

#[test]
fn protection_settings_refuse_the_root_and_removed_groups() {
    let k = kmem(4 * MB);
    assert_eq!(k.root().set_min(MB), Err(Error::RootGroup));
    assert_eq!(k.root().set_low(MB), Err(Error::RootGroup));
    let g = k.root().create_child("g").unwrap();
    g.set_min(MB).unwrap();
    g.set_low(2 * MB + 5).unwrap();
    let st = g.stat();
    assert_eq!((st.min, st.low), (MB, 2 * MB), "bytes, kept in whole pages");
    g.remove().unwrap();
    assert_eq!(g.set_min(MB), Err(Error::Removed));
    let st = g.stat();
    assert_eq!((st.min, st.low), (0, 0), "a removed group protects nothing");
}

/// Siblings under a parent's `max`: `a` with a `min`, `b` with a `low`, `c`
/// unprotected and allocating. Unprotected memory goes first; `low` is
/// breached only when nothing unprotected is left (a `low` event each
/// time), `min` never: then the allocation fails.
#[test]
fn siblings_with_min_and_low_under_a_parents_max() {
    let k = kmem(32 * MB);
    let lru = big_lru(k);
    let parent = capped_child(k, "parent", 40 * OBJ);
    let a = parent.create_child("a").unwrap();
    let b = parent.create_child("b").unwrap();
    let c = parent.create_child("c").unwrap();
    let d = parent.create_child("d").unwrap();
    a.set_min(10 * OBJ).unwrap();
    b.set_low(10 * OBJ).unwrap();
    assert_eq!(lru.add_in(&a, 10), 10);
    assert_eq!(lru.add_in(&b, 10), 10);
    assert_eq!(lru.add_in(&c, 20), 20);
    assert_eq!(parent.usage(), 40 * OBJ, "the parent is at its max");
    // c keeps allocating: every refused charge reclaims from c alone.
    assert_eq!(lru.add_in(&c, 60), 60, "c's own objects make room for c");
    assert_eq!((a.usage(), held(lru, &a)), (10 * OBJ, 10));
    assert_eq!((b.usage(), held(lru, &b)), (10 * OBJ, 10));
    assert!(parent.stat().events.max > 0);
    assert_eq!((b.stat().events.low, a.stat().events.min), (0, 0));
    // Nothing unprotected is left: c's objects are pinned, and what the
    // max leaves is filled with pinned objects too.
    let mut pins = pin(lru, &c);
    let room = (parent.max() - parent.usage()) / OBJ;
    pins.extend(pinned(k, &c, room));
    assert_eq!(parent.usage(), parent.max());
    // d allocates pinned objects: each refused charge finds nothing
    // unprotected, so a second pass breaches b's `low` (one event each),
    // taking 3 objects (the goal: 1 object plus 1/32 of the usage, 18
    // pages, met in whole objects); a's `min` holds. After 10 objects, 4
    // refusals (1, 4, 7, 10) emptied b.
    let d_pins = pinned(k, &d, 10);
    assert_eq!(d_pins.len(), 10);
    assert_eq!((a.usage(), held(lru, &a)), (10 * OBJ, 10), "a is within its min");
    assert_eq!(b.usage(), 0);
    assert_eq!(b.stat().events.low, 4, "one low event per breaching reclaim");
    // Only a's `min` is left: the next charge fails, and a keeps all.
    let oom = parent.stat().events.oom;
    assert!(pinned(k, &d, 1).is_empty(), "allocated through a's min");
    assert_eq!(parent.stat().events.oom, oom + 1);
    assert_eq!((a.usage(), held(lru, &a)), (10 * OBJ, 10));
    assert_eq!(a.stat().events.min, 0, "reclaim for others never breaches min");
    unpin(k, pins);
    unpin(k, d_pins);
    lru.retire();
}

/// Seed 002 under contention: a region too small for everyone, `a` with a
/// `min` and `b` with a `low` of exactly their usage, `c` with a soft
/// limit of 0 allocating far past the region. Contention reclaim takes
/// from c only; once c is pinned, b's `low` gives, a's `min` does not.
#[test]
fn contention_takes_unprotected_memory_first_and_never_breaches_min() {
    let k = kmem(8 * MB);
    let lru = big_lru(k);
    let root = k.root();
    let a = root.create_child("a").unwrap();
    let b = root.create_child("b").unwrap();
    let c = root.create_child("c").unwrap();
    a.set_min(MB).unwrap();
    b.set_low(MB).unwrap();
    c.set_soft_limit(0).unwrap();
    a.set_soft_limit(0).unwrap();
    b.set_soft_limit(0).unwrap();
    assert_eq!(lru.add_in(&a, MB / OBJ), MB / OBJ);
    assert_eq!(lru.add_in(&b, MB / OBJ), MB / OBJ);
    // 12 MB of objects through an 8 MB region.
    assert_eq!(lru.add_in(&c, 12 * MB / OBJ), 12 * MB / OBJ, "c's own objects make room for c");
    assert_eq!((a.usage(), held(lru, &a)), (MB, MB / OBJ));
    assert_eq!((b.usage(), held(lru, &b)), (MB, MB / OBJ));
    assert!(c.stat().soft_reclaim_passes > 0);
    assert_eq!(a.stat().soft_reclaim_passes + b.stat().soft_reclaim_passes, 0, "soft reclaim honours protection");
    assert_eq!(b.stat().events.low, 0);
    // With c pinned, c's allocations breach b's `low` until b is empty,
    // then fail; a keeps every object.
    let mut pins = pin(lru, &c);
    pins.extend(pinned(k, &c, 8 * MB / OBJ));
    assert_eq!(b.usage(), 0, "b's low gave way to the contention");
    assert!(b.stat().events.low > 0);
    assert_eq!((a.usage(), held(lru, &a)), (MB, MB / OBJ), "a's min held");
    assert_eq!(a.stat().events.min, 0);
    unpin(k, pins);
    lru.retire();
}

/// Overcommitted protection under contention: p protects 9 objects, its
/// children claim 12 (x 8, y 4). Contention reclaim takes from x and y
/// until their claims fit p's protection again, and no further.
#[test]
fn contention_reclaims_overcommitted_children_down_to_their_parents_min() {
    let k = kmem(8 * MB);
    let lru = big_lru(k);
    let root = k.root();
    let p = root.create_child("p").unwrap();
    let x = p.create_child("x").unwrap();
    let y = p.create_child("y").unwrap();
    let hog = root.create_child("hog").unwrap();
    p.set_min(9 * OBJ).unwrap();
    x.set_min(8 * OBJ).unwrap();
    y.set_min(4 * OBJ).unwrap();
    assert_eq!(lru.add_in(&x, 8), 8);
    assert_eq!(lru.add_in(&y, 4), 4);
    assert_eq!((effective(&root, &x).0, effective(&root, &y).0), (6, 3));
    let pins = pinned(k, &hog, 8 * MB / OBJ);
    assert!(pins.len() < 8 * MB / OBJ, "the hog ran out of memory");
    assert_eq!(p.usage(), 9 * OBJ, "x and y were reclaimed to p's min and no further");
    assert_eq!(x.usage() + y.usage(), 9 * OBJ);
    assert_eq!(held(lru, &x) + held(lru, &y), 9);
    assert!(y.usage() > 0 && x.usage() > y.usage());
    unpin(k, pins);
    lru.retire();
}

/// The old test of `low` only asked for `usage() > 0`: a group with soft
/// limit 0 under its `low`, whose excess over its soft limit is the
/// largest, keeps exactly what it has while another group (whose
/// parent's soft limit covers it) is reclaimed over and over.
#[test]
fn low_protects_and_hierarchy_soft_limit_covers_the_subtree() {
    let k = kmem(16 * MB);
    let lru = Lru::with_size(k, 1000);
    let parent = k.root().create_child("parent").unwrap();
    // Covers kid's usage; its excess stays under guarded's 4 MB.
    parent.set_soft_limit(10 * MB).unwrap();
    let kid = parent.create_child("kid").unwrap();
    let guarded = k.root().create_child("guarded").unwrap();
    guarded.set_soft_limit(0).unwrap();
    guarded.set_low(8 * MB).unwrap();
    assert_eq!(lru.add_in(&guarded, 4000), 4000);
    let kept = guarded.usage();
    assert!(kept > 3 * MB && kept < 8 * MB);
    assert_eq!(lru.add_in(&kid, 14_000), 14_000);
    // The parent's soft limit covers the kid: the kid's entries were
    // reclaimed through the parent; the guarded group, within its `low`
    // with unprotected memory left, lost nothing (not even its cached
    // free objects: protection covers all it is charged).
    assert!(parent.stat().soft_reclaim_passes > 0);
    assert_eq!(guarded.usage(), kept);
    assert_eq!(held(lru, &guarded), 4000);
    let st = guarded.stat();
    assert_eq!((st.soft_reclaim_passes, st.events.low), (0, 0));
    lru.retire();
}

/// A group's own `max` is not held back by its own `min`; that is the one
/// way a `min` is breached, and it is counted.
#[test]
fn a_groups_own_max_reclaims_through_its_min_and_counts_it() {
    let k = kmem(16 * MB);
    let lru = big_lru(k);
    let g = k.root().create_child("g").unwrap();
    g.set_min(MB).unwrap();
    assert_eq!(lru.add_in(&g, MB / OBJ), MB / OBJ);
    g.set_max(MB / 2).unwrap();
    assert!(g.usage() <= MB / 2);
    assert_eq!(g.stat().events.min, 1);
    // Above its min, its own reclaim counts nothing.
    g.set_min(MB / 4).unwrap();
    g.set_max(MB / 4 + OBJ).unwrap();
    assert_eq!(g.stat().events.min, 1);
    lru.retire();
}

/// Objects of a removed group are reclaimed with its nearest live
/// ancestor when the ancestor's subtree is visited group by group (a
/// protected sibling makes it so): `ShrinkControl::own_only` scopes take
/// them in.
#[test]
fn a_removed_childs_objects_are_reclaimed_with_its_parent() {
    let k = kmem(32 * MB);
    let lru = big_lru(k);
    let parent = capped_child(k, "parent", 20 * OBJ);
    let keep = parent.create_child("keep").unwrap();
    keep.set_min(10 * OBJ).unwrap();
    let gone = parent.create_child("gone").unwrap();
    let now = parent.create_child("now").unwrap();
    assert_eq!(lru.add_in(&keep, 10), 10);
    assert_eq!(lru.add_in(&gone, 10), 10);
    let gone_id: GroupId = gone.id();
    gone.remove().unwrap();
    drop(gone);
    // Pinned objects in `now`: only the removed group's objects can make
    // room, through the parent's own scope.
    let pins = pinned(k, &now, 10);
    assert_eq!(pins.len(), 10, "the removed group's objects were not reclaimed");
    assert_eq!(lru.entries.lock().unwrap().iter().filter(|(x, _)| *x == gone_id).count(), 0);
    assert_eq!((keep.usage(), held(lru, &keep)), (10 * OBJ, 10));
    unpin(k, pins);
    lru.retire();
}

/// `Cgroup::reclaim` (Linux `memory.reclaim`, issue 18 item 2) takes what
/// is asked, in whole objects, and no more.
#[test]
fn reclaim_takes_what_is_asked() {
    let k = kmem(16 * MB);
    let lru = big_lru(k);
    let g = k.root().create_child("g").unwrap();
    assert_eq!(lru.add_in(&g, 20), 20);
    // Shrinkers are asked for 1 object, then (at the 8 pages an object
    // gave) for what the rest needs: 1 + 2 + 5 + 2.
    assert_eq!(g.reclaim(10 * OBJ), 10 * OBJ);
    assert_eq!((g.usage(), held(lru, &g)), (10 * OBJ, 10));
    assert_eq!(g.reclaim(1), OBJ, "a byte takes a whole object");
    assert_eq!(g.reclaim(0), 0);
    assert_eq!(g.reclaim(usize::MAX), 9 * OBJ, "everything, and then it stops");
    assert_eq!(g.usage(), 0);
    assert_eq!(g.reclaim(OBJ), 0, "nothing left");
    lru.retire();
}

/// `Cgroup::reclaim` honours the protection below the group: `min` and
/// `low` first, then `low` gives (a `low` event) when nothing unprotected
/// is left, `min` never; the group's own `min` does not hold it back.
#[test]
fn reclaim_honours_the_protection_below_the_group() {
    let k = kmem(16 * MB);
    let lru = big_lru(k);
    let p = k.root().create_child("p").unwrap();
    let (a, b, c) = (p.create_child("a").unwrap(), p.create_child("b").unwrap(), p.create_child("c").unwrap());
    a.set_min(5 * OBJ).unwrap();
    b.set_low(5 * OBJ).unwrap();
    for g in [&a, &b, &c] {
        assert_eq!(lru.add_in(g, 10), 10);
    }
    // 25 objects: the unprotected 5 + 5 + 10 do not do, so b's low gives
    // the last 5.
    assert_eq!(p.reclaim(25 * OBJ), 25 * OBJ);
    assert_eq!((a.usage(), b.usage(), c.usage()), (5 * OBJ, 0, 0));
    assert_eq!((b.stat().events.low, a.stat().events.low, a.stat().events.min), (1, 0, 0));
    // Only a's min is left.
    assert_eq!(p.reclaim(10 * OBJ), 0);
    assert_eq!((a.usage(), held(lru, &a)), (5 * OBJ, 5));
    // Reclaim on a itself goes through its own min, and counts it.
    assert_eq!(a.reclaim(OBJ), OBJ);
    assert_eq!(a.stat().events.min, 1);
    // Atomic context reclaims nothing.
    {
        let _atomic = k.atomic_scope();
        assert_eq!(a.reclaim(OBJ), 0);
    }
    assert_eq!(a.usage(), 4 * OBJ);
    lru.retire();
}

/// The effective protection of `g` under `root` the slow, plain way (as
/// `Tree::protection` did before issue 26): each level from `root`'s child
/// down found by a walk up from `g`.
fn reference_protection(root: &Cgroup<'static, K>, g: &Cgroup<'static, K>) -> (usize, usize) {
    let (root, g) = (root.g(), g.g());
    let mut path = Vec::new();
    let mut cur = g;
    while !core::ptr::eq(cur, root) {
        path.push(cur);
        match cur.parent() {
            Some(p) => cur = p,
            None => return (0, 0),
        }
    }
    let on = (path.iter().all(|x| x.counter().min() > 0), path.iter().all(|x| x.counter().low() > 0));
    let claim = |x: &crate::cgroup::Group<DefaultRawMutex>| {
        let (min, low) = x.counter().protected();
        (if on.0 { min } else { 0 }, if on.1 { low } else { 0 })
    };
    let mut e = (0, 0);
    for (level, x) in path.iter().rev().enumerate() {
        let own = claim(x);
        e = if level == 0 {
            own
        } else {
            let sib = x.parent().unwrap().children().map(claim).fold((0, 0), |a, c| (a.0 + c.0, a.1 + c.1));
            let eff = |own: usize, parent: usize, sib: usize| {
                let v = if sib > parent { (own as u128 * parent as u128 / sib as u128) as usize } else { own };
                v.min(parent)
            };
            (eff(own.0, e.0, sib.0), eff(own.1, e.1, sib.1))
        };
    }
    e
}

/// Issue 26 item 15: `Tree::protection`, which takes the levels above a
/// group 64 at a time (it walked up once per level: `depth^2` per group,
/// `depth^3` for a walk of a chain), agrees with the plain computation for
/// every group and several roots of a tree deeper than that; and a reclaim
/// at the top of a 1,500-deep chain with `min` and `low` at every level
/// (3-6 s before) returns.
#[test]
fn protection_of_deep_trees_agrees_with_the_plain_computation() {
    let k = kmem(16 * MB);
    let top = k.root().create_child("top").unwrap();
    // A chain of 150 with a side branch of 3 at every fifth level, usages
    // and claims from a fixed sequence (some overcommitted, some zero).
    let mut seq = 12345u64;
    let mut next = || {
        seq = seq.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seq >> 33) as usize
    };
    let mut all = std::vec![top.clone()];
    let mut cur = top.clone();
    for d in 0..150 {
        let c = cur.create_child(&std::format!("c{d}")).unwrap();
        if d % 5 == 0 {
            for s in 0..3 {
                all.push(cur.create_child(&std::format!("s{d}-{s}")).unwrap());
            }
        }
        all.push(c.clone());
        cur = c;
    }
    for g in &all {
        g.set_min((next() % 500 + 1) * PAGE_SIZE).unwrap();
        if next() % 40 != 0 {
            g.set_low((next() % 800 + 1) * PAGE_SIZE).unwrap();
        }
    }
    // Charged leaves first: a charge goes to every ancestor too.
    let mut charged = Vec::new();
    for g in all.iter().rev() {
        let pages = next() % 4;
        g.g().counter().charge(pages);
        charged.push((g.clone(), pages));
    }
    let _read = k.tree().read_guard();
    let mut nonzero = 0;
    for root in [&k.root(), &all[0], &all[7], &all[100]] {
        for g in &all {
            let e = Tree::<DefaultRawMutex>::protection(root.g(), g.g());
            assert_eq!((e.min, e.low), reference_protection(root, g), "group {}", g.name());
            nonzero += usize::from(e.min != 0);
        }
    }
    assert!(nonzero > 200, "only {nonzero} protected: the test tree protects too little");
    drop(_read);
    for (g, pages) in charged {
        g.g().counter().uncharge(pages);
    }
    // The deep chain: one allocation over the top's max reclaims it
    // (everything in it protected), and returns.
    let deep = k.root().create_child("deep").unwrap();
    deep.set_max(64 * PAGE_SIZE).unwrap();
    let mut cur = deep.clone();
    let mut chain = Vec::new();
    for d in 0..1_500 {
        let c = cur.create_child(&std::format!("d{d}")).unwrap();
        c.set_min(MB).unwrap();
        c.set_low(MB).unwrap();
        chain.push(c.clone());
        cur = c;
    }
    let held = pinned(k, &cur, 64);
    assert!(held.len() < 64, "the max did not hold");
    unpin(k, held);
    for c in chain.into_iter().rev() {
        c.remove().unwrap();
    }
    deep.remove().unwrap();
}
