//! What the program checks, with SysTick allocating in its handler all
//! along: the tutorial heap tests, collections, a typed cache, a limited
//! group; then the interrupt counts, and that a shrink gives every page
//! back.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::sync::atomic::Ordering;

use kmemcg::{CacheFlags, Error};

use super::cpu::{self, IRQ_ALLOCS, IRQ_FAILURES, TICKS};
use super::semihosting::{self, println};
use kernel_common::tutorial_heap;

use super::Heap;

type Test = Result<(), &'static str>;

/// SysTick interrupts per second.
const SYSTICK_HZ: u32 = 1000;
/// Interrupt-context allocations to wait for before SysTick stops.
const MIN_IRQ_ALLOCS: usize = 100;
/// The limited group's max: two pages. The group itself, its child
/// cache and the typed cache's descriptor take five more pages of the 16
/// (allocator metadata, charged to nobody).
const LIMIT: usize = 8 << 10;

fn check(ok: bool, what: &'static str) -> Test {
    if ok { Ok(()) } else { Err(what) }
}

/// `r`, or `what` failed, with the error printed.
fn or_fail<T>(r: Result<T, Error>, what: &'static str) -> Result<T, &'static str> {
    r.map_err(|e| {
        println!("{what}: {e}");
        what
    })
}

/// Runs every check, printing as it goes.
pub fn run(kmem: &'static Heap) -> Test {
    // An allocation in interrupt context never reclaims: it is served
    // from what its class has, or fails. When the limited group drains
    // the heap, reclaim frees every empty slab, so the handler's two
    // classes (64 and 48 bytes) keep one object each here: their slabs
    // never empty, and the handler always finds a free object.
    let pins = (cpu::irq_objects().ok_or("the SysTick handler's objects")?, cpu::irq_objects());
    cpu::start_systick(SYSTICK_HZ);
    tutorial_heap::run(|step| println!("heap suite: {step} ok")).map_err(|e| {
        println!("heap suite: {e}");
        "the tutorial heap suite failed"
    })?;
    collections()?;
    typed_cache(kmem)?;
    limited_group(kmem)?;
    while IRQ_ALLOCS.load(Ordering::Relaxed) < MIN_IRQ_ALLOCS && IRQ_FAILURES.load(Ordering::Relaxed) == 0 {
        cpu::wait_for_interrupt();
    }
    cpu::stop_systick();
    drop(pins);
    let (ticks, allocs, failures) =
        (TICKS.load(Ordering::Relaxed), IRQ_ALLOCS.load(Ordering::Relaxed), IRQ_FAILURES.load(Ordering::Relaxed));
    println!("systick: {ticks} interrupts, {allocs} allocations in interrupt context, {failures} failed");
    check(failures == 0, "an allocation in the SysTick handler failed")?;

    let in_use = kmem.stats().source.pages_in_use;
    kmem.shrink();
    let after = kmem.stats();
    println!(
        "heap: {in_use} pages in use at the end (empty slabs, magazines, group metadata), {} after a shrink, {} bad frees",
        after.source.pages_in_use, after.bad_frees
    );
    check(after.bad_frees == 0, "kmemcg saw frees of pointers it does not own")?;
    check(after.source.pages_in_use == 0, "pages still in use after a shrink")
}

/// Each collection is checked and dropped before the next: in 16 pages,
/// every size class a growing collection passes through holds a slab of
/// its own (see the README's *Small memory*).
fn collections() -> Test {
    let v: Vec<u32> = (0..1000).collect();
    check(v.iter().sum::<u32>() == 1000 * 999 / 2, "Vec<u32> sum")?;
    drop(v);

    // 1009 is prime, so these 200 keys are distinct.
    let key = |i: u16| i * 331 % 1009;
    let mut map = BTreeMap::new();
    for i in 0..200u16 {
        map.insert(key(i), format!("reading-{i}"));
    }
    check(map.len() == 200, "BTreeMap length")?;
    check((0..200).all(|i| map[&key(i)] == format!("reading-{i}")), "BTreeMap contents")?;
    check(map.keys().zip(map.keys().skip(1)).all(|(a, b)| a < b), "BTreeMap order")?;
    drop(map);

    let mut s = String::new();
    for i in 0..1000u32 {
        s.push(char::from(b'a' + (i % 26) as u8));
    }
    check(s.len() == 1000 && s.starts_with("abcdefghijklmnopqrstuvwxyzab"), "String contents")?;
    println!("collections: Vec, BTreeMap, String ok");
    Ok(())
}

/// An object for the typed cache (the `f32` goes through the FPU).
struct Reading {
    sensor: u16,
    seq: u32,
    celsius: f32,
}

fn typed_cache(kmem: &'static Heap) -> Test {
    let readings = or_fail(kmem.create_cache::<Reading>("reading", CacheFlags::ACCOUNT), "create_cache(reading)")?;
    let mut live = Vec::with_capacity(500);
    for seq in 0..500u32 {
        let r = Reading { sensor: (seq % 7) as u16, seq, celsius: 20.0 + seq as f32 * 0.25 };
        live.push(or_fail(readings.alloc(r), "reading cache allocation")?);
    }
    let ok = live.iter().enumerate().all(|(i, r)| {
        let i = i as u32;
        r.seq == i && r.sensor == (i % 7) as u16 && r.celsius == 20.0 + i as f32 * 0.25
    });
    check(ok, "reading contents")?;
    let st = readings.stats();
    println!("typed cache 'reading': {} objects in {} slabs ({} pages)", st.active_objects, st.slabs, st.pages);
    check(st.active_objects >= 500, "reading cache statistics")?;
    drop(live);
    println!("typed cache 'reading': 500 allocated, verified, freed");
    Ok(())
}

/// A 256-byte object for the limited group.
struct Frame {
    seq: u32,
    data: [u8; 252],
}

fn limited_group(kmem: &'static Heap) -> Test {
    let g = or_fail(kmem.root().create_child("sensors"), "create_child(sensors)")?;
    or_fail(g.set_max(LIMIT), "set_max(sensors)")?;
    let frames = or_fail(kmem.create_cache::<Frame>("frame", CacheFlags::ACCOUNT), "create_cache(frame)")?;
    // Room for more frames than the limit allows, charged to the root
    // (allocated before entering the group).
    let mut held = Vec::with_capacity(2 * LIMIT / 256);
    let (err, big) = {
        let _in = g.enter();
        let err = loop {
            if held.len() == held.capacity() {
                return Err("sensors allocated past its limit");
            }
            let seq = held.len() as u32;
            match frames.alloc(Frame { seq, data: [seq as u8; 252] }) {
                Ok(f) => held.push(f),
                Err(e) => break e,
            }
        };
        // The global allocator charges the entered group too: this
        // fails cleanly instead of aborting.
        let mut v: Vec<u8> = Vec::new();
        (err, v.try_reserve_exact(LIMIT))
    };
    match err {
        Error::LimitExceeded { group, max } => {
            println!("sensors: {} frames of 256 bytes, then {err}", held.len());
            check(group.as_str() == "sensors" && max == LIMIT, "the error names another limit")?;
        }
        _ => {
            println!("sensors: {} frames, then {err}", held.len());
            return Err("sensors failed with something other than LimitExceeded");
        }
    }
    check(big.is_err(), "sensors reserved 8 KiB past its limit")?;
    println!("sensors: Vec::try_reserve_exact(8 KiB) -> Err (clean failure)");
    check(!held.is_empty() && held.len() * 256 <= LIMIT, "sensors frame count")?;
    check(held.iter().enumerate().all(|(i, f)| f.seq == i as u32 && f.data[251] == i as u8), "sensors frames")?;
    check(g.failcnt() > 0 && g.usage() <= LIMIT, "sensors usage and failcnt")?;
    semihosting::print_lines("stat: ", format_args!("{}", g.stat()));
    drop(held);
    drop(frames);
    or_fail(g.remove(), "remove(sensors)")?;
    println!("sensors: freed and removed");
    Ok(())
}
