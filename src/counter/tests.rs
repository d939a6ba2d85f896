use std::boxed::Box;
use std::thread;
use std::vec;
use std::vec::Vec;

use super::*;

/// root → a → b, leaked so the parent pointers stay valid.
fn chain() -> (&'static PageCounter, &'static PageCounter, &'static PageCounter) {
    let root: &'static PageCounter = Box::leak(Box::new(PageCounter::new_root()));
    // SAFETY: parents are leaked, so they outlive their children.
    let a: &'static PageCounter = Box::leak(Box::new(unsafe { PageCounter::with_parent(root) }));
    // SAFETY: as above.
    let b: &'static PageCounter = Box::leak(Box::new(unsafe { PageCounter::with_parent(a) }));
    (root, a, b)
}

#[test]
fn charges_propagate_and_fail_at_the_refusing_ancestor() {
    let (root, a, b) = chain();
    a.set_max(10).unwrap();
    b.try_charge(6).unwrap();
    assert_eq!((root.usage(), a.usage(), b.usage()), (6, 6, 6));
    let err = b.try_charge(5).unwrap_err();
    assert!(core::ptr::eq(err, a), "the parent refused");
    assert_eq!((root.usage(), a.usage(), b.usage()), (6, 6, 6), "rolled back at every level");
    assert_eq!((a.failcnt(), b.failcnt()), (1, 0));
    b.try_charge(4).unwrap();
    assert_eq!(a.usage(), 10);
    // A child limit above the parent's is allowed; the parent still binds.
    b.set_max(100).unwrap();
    assert!(b.try_charge(1).is_err());
    b.uncharge(10);
    assert_eq!((root.usage(), a.usage(), b.usage()), (0, 0, 0));
    assert_eq!(a.watermark(), 10);
    a.reset_watermark();
    assert_eq!(a.watermark(), 0);
}

/// Extreme values on the charge variants: an overdraft of `usize::MAX`
/// saturates instead of wrapping, a charge of `usize::MAX` is refused with
/// nothing left charged, and a quiet refusal is not counted.
#[test]
fn charge_variants_at_the_extremes() {
    let (root, a, b) = chain();
    a.set_max(10).unwrap();
    b.try_charge_over(1000, usize::MAX).unwrap();
    assert_eq!((root.usage(), a.usage(), b.usage()), (1000, 1000, 1000));
    b.uncharge(1000);
    b.try_charge(4).unwrap();
    assert!(b.try_charge_over(usize::MAX, usize::MAX).is_err(), "a charge that overflows usage");
    assert!(b.try_charge_over(usize::MAX, 0).is_err());
    assert_eq!((root.usage(), a.usage(), b.usage()), (4, 4, 4), "nothing stays charged");
    let counted = a.failcnt();
    assert!(core::ptr::eq(b.try_charge_quiet(7).unwrap_err(), a));
    assert_eq!(a.failcnt(), counted, "a quiet refusal counted");
    assert_eq!(a.usage(), 4);
    b.try_charge_over(7, 1).unwrap();
    assert_eq!(a.usage(), 11);
    b.uncharge(11);
    assert_eq!((root.usage(), a.usage(), b.usage()), (0, 0, 0));
}

#[test]
fn forced_charge_ignores_limits() {
    let (_, a, b) = chain();
    a.set_max(1).unwrap();
    b.charge(5);
    assert_eq!(a.usage(), 5);
    assert_eq!(a.watermark(), 5);
    b.uncharge(5);
}

#[test]
fn set_max_refuses_below_usage() {
    let (_, a, b) = chain();
    b.try_charge(8).unwrap();
    assert_eq!(a.set_max(7), Err(8));
    assert_eq!(a.max(), usize::MAX, "the old limit stays");
    a.set_max(8).unwrap();
    a.set_max(0).unwrap_err();
    b.uncharge(8);
    a.set_max(0).unwrap();
    assert!(b.try_charge(1).is_err(), "a limit of 0 refuses everything");
    a.set_max(usize::MAX).unwrap();
    b.try_charge(usize::MAX / 2).unwrap();
    assert!(b.try_charge(usize::MAX / 2 + 2).is_err(), "overflow is refused, not wrapped");
    b.uncharge(usize::MAX / 2);
    assert_eq!(b.usage(), 0);
}

#[test]
fn stock_takes_refills_and_drains() {
    let (root, a, _) = chain();
    a.try_charge_stocked(Some(0), 1).unwrap();
    assert_eq!(a.usage(), 1 + STOCK_BATCH, "one refill charged a batch");
    assert_eq!(a.stocked(), STOCK_BATCH);
    for _ in 0..STOCK_BATCH {
        a.try_charge_stocked(Some(0), 1).unwrap();
    }
    assert_eq!(a.usage(), 1 + STOCK_BATCH, "served from the stock");
    assert_eq!(a.stocked(), 0);
    a.uncharge_stocked(Some(0), 1 + STOCK_BATCH);
    assert_eq!(a.stocked(), 1 + STOCK_BATCH);
    a.charge(STOCK_MAX);
    a.uncharge_stocked(Some(0), STOCK_MAX);
    assert_eq!(a.stocked(), STOCK_MAX, "the stock is capped");
    assert_eq!(a.usage(), STOCK_MAX, "the excess over the cap was uncharged");
    assert_eq!(a.drain_stock(), STOCK_MAX);
    assert_eq!((root.usage(), a.usage()), (0, 0));
}

#[test]
fn stock_never_pushes_usage_over_max() {
    let (_, a, _) = chain();
    a.set_max(10).unwrap();
    // Refills that would cross the limit fall back to an exact charge.
    for _ in 0..10 {
        a.try_charge_stocked(Some(1), 1).unwrap();
        assert!(a.usage() <= 10);
    }
    assert!(a.try_charge_stocked(Some(1), 1).is_err());
}

#[test]
fn concurrent_charges_end_at_zero() {
    let (root, a, b) = chain();
    a.set_max(1000).unwrap();
    let hs: Vec<_> = (0..4)
        .map(|t| {
            thread::spawn(move || {
                let mut held = 0;
                for i in 0..20_000 {
                    let slot = if t % 2 == 0 { Some(t) } else { None };
                    if i % 3 != 2 {
                        if b.try_charge_stocked(slot, 1 + i % 4).is_ok() {
                            held += 1 + i % 4;
                        }
                    } else if held > 0 {
                        b.uncharge_stocked(slot, held);
                        held = 0;
                    }
                    assert!(a.usage() <= 1000, "over max");
                }
                b.uncharge(held);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    b.drain_stock();
    assert_eq!((root.usage(), a.usage(), b.usage()), (0, 0, 0));
}

#[test]
fn effective_protection_keeps_claims_that_fit_and_shares_out_overcommitted_ones() {
    use super::effective_protection;
    // Claims of 64 and 32 pages under a parent protecting 72: 48 and 24.
    assert_eq!(effective_protection(64, 72, 96), 48);
    assert_eq!(effective_protection(32, 72, 96), 24);
    // Claims that fit are kept.
    assert_eq!(effective_protection(30, 72, 62), 30);
    assert_eq!(effective_protection(72, 72, 72), 72);
    // An unprotected parent passes nothing down.
    assert_eq!(effective_protection(10, 0, 10), 0);
    // Claims read at different times that disagree stay bounded by the
    // parent's protection.
    assert_eq!(effective_protection(100, 50, 40), 50);
    assert_eq!(effective_protection(usize::MAX, usize::MAX - 1, usize::MAX), usize::MAX - 1);
}

#[test]
fn protected_is_usage_up_to_each_setting() {
    let root = PageCounter::new_root();
    root.set_min(10);
    root.set_low(30);
    root.charge(20);
    assert_eq!(root.protected(), (10, 20));
    assert_eq!((root.min(), root.low()), (10, 30));
    root.uncharge(20);
}

/// A charge refused at some level raises no watermark below it: the peak
/// of a child never shows pages its parent refused. Twelve levels, so the
/// levels past the ones that note their own add's usage are covered too.
#[test]
fn a_refused_charge_raises_no_watermark() {
    let mut levels: Vec<&'static PageCounter> = vec![Box::leak(Box::new(PageCounter::new_root()))];
    for _ in 0..11 {
        let parent = *levels.last().unwrap();
        // SAFETY: every level is leaked, so it outlives its children.
        levels.push(Box::leak(Box::new(unsafe { PageCounter::with_parent(parent) })));
    }
    let leaf = levels[11];
    for refusing in [0, 1, 5, 10] {
        levels[refusing].set_max(3).unwrap();
        leaf.try_charge(2).unwrap();
        assert!(core::ptr::eq(leaf.try_charge(2).unwrap_err(), levels[refusing]));
        for (i, l) in levels.iter().enumerate() {
            assert_eq!((l.usage(), l.watermark()), (2, 2), "level {i}, refused at {refusing}");
        }
        leaf.try_charge(1).unwrap();
        assert!(levels.iter().all(|l| l.watermark() == 3));
        leaf.uncharge(3);
        levels[refusing].set_max(usize::MAX).unwrap();
        levels.iter().for_each(|l| l.reset_watermark());
    }
    // An overdraft's peak is what it charged, at every level.
    levels[0].set_max(1).unwrap();
    leaf.try_charge_over(3, 2).unwrap();
    assert!(levels.iter().all(|l| l.watermark() == 3));
    leaf.uncharge(3);
}

/// A charge for pages still to be found notes no watermark until
/// `note_charged`, at any level below `stop`; given back before, it leaves
/// every peak as it was.
#[test]
fn a_pending_charge_shows_in_peaks_once_noted() {
    let root: &'static PageCounter = Box::leak(Box::new(PageCounter::new_root()));
    // SAFETY: leaked, so each outlives its child.
    let mid: &'static PageCounter = Box::leak(Box::new(unsafe { PageCounter::with_parent(root) }));
    // SAFETY: as above.
    let leaf: &'static PageCounter = Box::leak(Box::new(unsafe { PageCounter::with_parent(mid) }));
    leaf.try_charge(2).unwrap();
    leaf.try_charge_pending(5, 0, true, core::ptr::null()).unwrap();
    assert_eq!([leaf, mid, root].map(|c| (c.usage(), c.watermark())), [(7, 2); 3]);
    leaf.uncharge(5);
    assert_eq!([leaf, mid, root].map(|c| (c.usage(), c.watermark())), [(2, 2); 3]);
    leaf.try_charge_pending(3, 0, true, core::ptr::null()).unwrap();
    leaf.note_charged(root, 0);
    assert_eq!([leaf, mid, root].map(|c| c.watermark()), [5, 5, 2], "levels below `stop` only");
    leaf.note_charged(core::ptr::null(), 0);
    assert_eq!(root.watermark(), 5);
    // A pending charge a level refuses counts in its `failcnt` if asked.
    mid.set_max(6).unwrap();
    assert!(core::ptr::eq(leaf.try_charge_pending(2, 0, true, core::ptr::null()).unwrap_err(), mid));
    assert!(leaf.try_charge_pending(2, 0, false, core::ptr::null()).is_err());
    assert_eq!(mid.failcnt(), 1);
    // Another charge in flight that `mid` is about to refuse (its add,
    // before the check) is not noted past what `mid` allows (a review
    // saw a refused 1 EiB growth in a peak through `note_charged`).
    mid.reset_watermark();
    mid.usage.fetch_add(1000, crate::sync::Ordering::Relaxed);
    leaf.note_charged(core::ptr::null(), 0);
    assert_eq!(mid.watermark(), 6);
    leaf.note_charged(core::ptr::null(), 2);
    assert_eq!(mid.watermark(), 8, "a callback's overdraft may pass `max` by `extra`");
    mid.usage.fetch_sub(1000, crate::sync::Ordering::Relaxed);
    leaf.uncharge(5);
}
