//! The SMP self-test: every CPU at once runs collections, a shared typed
//! cache, objects freed by another CPU than the one that allocated them,
//! and a limited group filled to its max, with the timer allocating in
//! interrupt context; then the boot CPU prints per-CPU statistics, checks
//! the groups, and runs the timing comparison (`bench`).

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::alloc::Layout;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use kmemcg::allocator_api2::alloc::Allocator;
use kmemcg::{CacheBox, CacheFlags, Cgroup, CgroupAllocator, Error, KmemCache};

use super::bench;
use super::cpu::{self, CPUS, MAX_CPUS};
use super::serial::kprintln;
use super::sync::{Barrier, Failure};
use super::{Heap, KMEM};

type Test<T = ()> = Result<T, &'static str>;

/// The limited group's max.
const LIMIT: usize = 256 * 1024;
/// Rounds of the collections workload per CPU.
const ROUNDS: usize = 3;
/// Typed-cache objects each CPU allocates, and how many it hands on.
const INODES: usize = 400;
const SENT_INODES: usize = 150;
/// Global-allocator boxes each CPU hands on.
const SENT_BOXES: usize = 100;
/// The blocks allocated through the limited group's allocator.
const BLOCK: usize = 256;

fn check(ok: bool, what: &'static str) -> Test {
    if ok { Ok(()) } else { Err(what) }
}

/// An object of the shared typed cache.
pub struct Inode {
    ino: u64,
    owner: u32,
    name: [u8; 20],
}

impl Inode {
    fn new(ino: u64, owner: usize) -> Self {
        Inode { ino, owner: owner as u32, name: [(ino % 251) as u8; 20] }
    }

    fn is(&self, ino: u64, owner: usize) -> bool {
        self.ino == ino && self.owner == owner as u32 && self.name == [(ino % 251) as u8; 20]
    }
}

/// What one CPU hands to the next, which frees it.
struct Parcel {
    from: usize,
    inodes: Vec<CacheBox<'static, Inode, Heap>>,
    /// One global-allocator object each (the point is the many frees).
    #[allow(clippy::vec_box)]
    boxes: Vec<Box<[u64; 8]>>,
}

/// What one CPU holds in the limited group until every CPU has hit its
/// max.
struct Held {
    alloc: CgroupAllocator<'static, Heap>,
    blocks: Vec<NonNull<[u8]>>,
    inodes: Vec<CacheBox<'static, Inode, Heap>>,
}

/// One CPU's results, read by the boot CPU after a barrier.
pub struct CpuResult {
    limited_objects: AtomicUsize,
    limit_errors: AtomicUsize,
    received: AtomicUsize,
    failure: Failure,
}

impl CpuResult {
    const fn new() -> Self {
        CpuResult {
            limited_objects: AtomicUsize::new(0),
            limit_errors: AtomicUsize::new(0),
            received: AtomicUsize::new(0),
            failure: Failure::new(),
        }
    }
}

/// What every CPU of the test shares (leaked by the boot CPU).
pub struct Shared {
    /// CPUs taking part.
    pub n: usize,
    pub barrier: Barrier,
    inodes: KmemCache<'static, Inode, Heap>,
    tenant: Cgroup<'static, Heap>,
    limited: Cgroup<'static, Heap>,
    /// `mailboxes[i]`: the parcel for CPU `i`.
    mailboxes: [AtomicPtr<Parcel>; MAX_CPUS],
    pub results: [CpuResult; MAX_CPUS],
}

static SHARED: AtomicPtr<Shared> = AtomicPtr::new(core::ptr::null_mut());

/// The boot CPU's part: sets up the shared state, runs the workload with
/// the others, checks and prints, then the timing comparison.
pub fn run(n: usize) -> Test {
    let root = KMEM.root();
    let tenant = root.create_child("tenant").map_err(|_| "create_child(tenant)")?;
    let limited = root.create_child("limited").map_err(|_| "create_child(limited)")?;
    limited.set_max(LIMIT).map_err(|_| "set_max(limited)")?;
    let inodes = KMEM.create_cache::<Inode>("inode", CacheFlags::ACCOUNT).map_err(|_| "create_cache(inode)")?;
    let shared = Box::leak(Box::new(Shared {
        n,
        barrier: Barrier::new(n),
        inodes,
        tenant,
        limited,
        mailboxes: [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_CPUS],
        results: [const { CpuResult::new() }; MAX_CPUS],
    }));
    SHARED.store(shared, Ordering::Release);
    let sh: &'static Shared = shared;
    kprintln!("self-test: {n} CPUs, groups 'tenant' and 'limited' (max {} KiB), typed cache 'inode'", LIMIT >> 10);
    cpu::irq_enable();
    on_every_cpu(sh, 0);
    check_results(sh)?;
    bench::run(&bench::Team { n: sh.n, barrier: &sh.barrier }, 0);
    Ok(())
}

/// A secondary CPU's part, in step with the boot CPU.
pub fn secondary(me: usize) {
    let sh = loop {
        let p = SHARED.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: the boot CPU published a leaked `Shared`, never freed.
            break unsafe { &*p };
        }
        core::hint::spin_loop();
    };
    cpu::irq_enable();
    on_every_cpu(sh, me);
    bench::run(&bench::Team { n: sh.n, barrier: &sh.barrier }, me);
}

/// The workload every CPU runs at the same time, between barriers.
fn on_every_cpu(sh: &'static Shared, me: usize) {
    let result = &sh.results[me];
    sh.barrier.wait(); // start together
    let guard = sh.tenant.enter();
    let held = workload(sh, me).map_err(|e| result.failure.set(e)).ok();
    sh.barrier.wait(); // every CPU has filled the limited group and posted a parcel
    if let Some(Err(e)) = held.map(|held| release(sh, me, held)) {
        result.failure.set(e);
    }
    drop(guard);
    // The timer must have allocated on this CPU at least once.
    let deadline = cpu::ticks() + 10 * cpu::ticks_per_second();
    while cpu::this().irq_allocs.load(Ordering::Relaxed) == 0 {
        if cpu::ticks() > deadline {
            result.failure.set("no allocation in interrupt context within 10 s");
            break;
        }
        cpu::wait_for_interrupt();
    }
    sh.barrier.wait(); // all done
}

/// Collections, the typed cache, the parcel for the next CPU, the
/// limited group; all charged to 'tenant' (this CPU's current group)
/// except what goes to 'limited'.
fn workload(sh: &'static Shared, me: usize) -> Test<Held> {
    for round in 0..ROUNDS {
        collections(me, round)?;
    }
    let parcel = typed_cache(sh, me)?;
    let next = (me + 1) % sh.n;
    sh.mailboxes[next].store(Box::into_raw(Box::new(parcel)), Ordering::Release);
    fill_limited(sh, me)
}

fn collections(me: usize, round: usize) -> Test {
    let k = (me * ROUNDS + round) as u64 + 1;
    let v: Vec<u64> = (0..4000).map(|i| i * k).collect();
    check(v.iter().sum::<u64>() == k * 4000 * 3999 / 2, "Vec<u64> sum")?;

    // 10007 is prime, so these keys are distinct.
    let key = |i: u32| (i * 7919 + me as u32) % 10007;
    let map: BTreeMap<u32, String> = (0..300).map(|i| (key(i), format!("cpu{me}-{round}-{i}"))).collect();
    check(map.len() == 300, "BTreeMap length")?;
    check((0..300).all(|i| map[&key(i)] == format!("cpu{me}-{round}-{i}")), "BTreeMap contents")?;

    let mut s = String::new();
    for i in 0..500u32 {
        s.push(char::from(b'a' + ((i + me as u32) % 26) as u8));
    }
    check(s.len() == 500 && s.as_bytes()[0] == b'a' + me as u8 % 26, "String contents")?;

    let boxed: Box<[u64; 64]> = Box::new([k; 64]);
    let f: Box<dyn Fn(u64) -> u64> = Box::new(move |x| x + boxed.iter().sum::<u64>());
    check(f(1) == 1 + 64 * k, "Box<dyn Fn>")?;

    let big = alloc::vec![me as u8; 256 << 10];
    check(big.iter().all(|&b| b == me as u8), "256 KiB Vec<u8> contents")?;
    Ok(())
}

/// Allocates `INODES` objects of the shared cache, verifies them, frees
/// most, and returns the parcel for the next CPU.
fn typed_cache(sh: &'static Shared, me: usize) -> Test<Parcel> {
    let mut live = Vec::with_capacity(INODES);
    for i in 0..INODES as u64 {
        live.push(sh.inodes.alloc(Inode::new(i, me)).map_err(|_| "inode cache allocation")?);
    }
    check(live.iter().enumerate().all(|(i, x)| x.is(i as u64, me)), "inode contents")?;
    let inodes: Vec<_> = live.drain(..SENT_INODES).collect();
    drop(live);
    let boxes = (0..SENT_BOXES).map(|i| Box::new([(me * 1000 + i) as u64; 8])).collect();
    Ok(Parcel { from: me, inodes, boxes })
}

/// Allocates through the limited group (its `Allocator`, then the typed
/// cache's `alloc_in`) until each fails, and checks that the failure is
/// the limited group's alone.
fn fill_limited(sh: &'static Shared, me: usize) -> Test<Held> {
    let result = &sh.results[me];
    let alloc = sh.limited.allocator();
    let layout = Layout::from_size_align(BLOCK, 8).map_err(|_| "layout")?;
    let cap = LIMIT / BLOCK + 64;
    let mut blocks = Vec::with_capacity(cap);
    while let Ok(p) = alloc.allocate(layout) {
        // SAFETY: a fresh block of `BLOCK` bytes.
        unsafe { p.cast::<u8>().as_ptr().write_bytes(me as u8, BLOCK) };
        blocks.push(p);
        if blocks.len() == cap {
            return Err("the limited group's allocator allocated past its max");
        }
    }
    let mut inodes = Vec::with_capacity(cap);
    let err = loop {
        match sh.inodes.alloc_in(&sh.limited, Inode::new(inodes.len() as u64, me)) {
            Ok(x) => inodes.push(x),
            Err(e) => break e,
        }
        if inodes.len() == cap {
            return Err("alloc_in(limited) allocated past its max");
        }
    };
    match err {
        Error::LimitExceeded { group, max } if group.as_str() == "limited" && max == LIMIT => {}
        _ => return Err("alloc_in(limited) failed with another error than the limited group's limit"),
    }
    result.limit_errors.store(2, Ordering::Relaxed);
    result.limited_objects.store(blocks.len() + inodes.len(), Ordering::Relaxed);

    // The failures stay in the limited group: while it is full, the
    // current group ('tenant') and the root still allocate.
    let mut v: Vec<u8> = Vec::new();
    check(v.try_reserve_exact(128 << 10).is_ok(), "tenant allocation while 'limited' is full")?;
    let in_root =
        sh.inodes.alloc_in(&KMEM.root(), Inode::new(7, me)).map_err(|_| "root allocation while 'limited' is full")?;
    check(in_root.is(7, me), "root inode")?;
    Ok(Held { alloc, blocks, inodes })
}

/// Frees what this CPU holds in the limited group, then the parcel the
/// previous CPU left it, after checking its contents.
fn release(sh: &'static Shared, me: usize, held: Held) -> Test {
    let layout = Layout::from_size_align(BLOCK, 8).map_err(|_| "layout")?;
    for p in held.blocks {
        // SAFETY: each block came from this allocator with this layout and
        // is freed once. (Its first byte is what this CPU wrote.)
        unsafe {
            if *p.cast::<u8>().as_ptr() != me as u8 {
                return Err("limited block contents");
            }
            held.alloc.deallocate(p.cast(), layout);
        }
    }
    check(held.inodes.iter().enumerate().all(|(i, x)| x.is(i as u64, me)), "limited inode contents")?;
    drop(held.inodes);

    let p = sh.mailboxes[me].swap(core::ptr::null_mut(), Ordering::Acquire);
    if p.is_null() {
        return Err("no parcel from the previous CPU");
    }
    // SAFETY: the previous CPU stored `Box::into_raw` of its parcel here
    // before the barrier; swapped out, it is this CPU's alone.
    let parcel = unsafe { Box::from_raw(p) };
    let from = (me + sh.n - 1) % sh.n;
    check(parcel.from == from, "parcel sender")?;
    check(parcel.inodes.iter().enumerate().all(|(i, x)| x.is(i as u64, from)), "parcel inodes")?;
    check(
        parcel.boxes.iter().enumerate().all(|(i, b)| b.iter().all(|&x| x == (from * 1000 + i) as u64)),
        "parcel boxes",
    )?;
    sh.results[me].received.store(parcel.inodes.len() + parcel.boxes.len(), Ordering::Relaxed);
    drop(parcel); // frees on this CPU what another CPU allocated
    Ok(())
}

/// The boot CPU, after the workload: the per-CPU lines, then the checks.
fn check_results(sh: &'static Shared) -> Test {
    let n = sh.n;
    let mut failed = None;
    for (i, r) in sh.results[..n].iter().enumerate() {
        if let Some(e) = r.failure.get() {
            kprintln!("self-test: CPU {i} failed: {e}");
            failed = failed.or(Some(e));
        }
    }
    let mut ok = true;
    for (i, block) in CPUS[..n].iter().enumerate() {
        let st = KMEM.slot_stats(i);
        let irq = block.irq_allocs.load(Ordering::Relaxed);
        // Magazine hits take the fast path, which counts nothing: a CPU's
        // refills and spills show its magazines at work.
        kprintln!(
            "cpu {i}: magazine refills and spills {}, slow-path hits {}, irq allocations {irq}",
            st.misses,
            st.hits
        );
        ok &= st.misses > 0 && irq > 0;
    }
    if let Some(e) = failed {
        return Err(e);
    }
    check(ok, "a CPU never used its magazines or had no interrupt-context allocations")?;

    let moved: usize = sh.results[..n].iter().map(|r| r.received.load(Ordering::Relaxed)).sum();
    check(moved == n * (SENT_INODES + SENT_BOXES), "objects freed on another CPU")?;
    kprintln!("cross-CPU: {moved} objects allocated on one CPU were freed on the next");

    let (root, tenant, limited) = (KMEM.root(), &sh.tenant, &sh.limited);
    let held: usize = sh.results[..n].iter().map(|r| r.limited_objects.load(Ordering::Relaxed)).sum();
    let errors: usize = sh.results[..n].iter().map(|r| r.limit_errors.load(Ordering::Relaxed)).sum();
    kprintln!(
        "group limited: {held} objects held at once by {n} CPUs, {errors} LimitExceeded errors, peak {} KiB of max {} KiB, failcnt {}",
        limited.peak() >> 10,
        limited.max() >> 10,
        limited.failcnt()
    );
    check(errors == 2 * n && limited.failcnt() > 0, "the limited group never refused a charge")?;
    check(limited.peak() <= LIMIT, "the limited group went past its max")?;
    kprintln!(
        "group tenant: peak {} KiB, failcnt {}; root failcnt {}",
        tenant.peak() >> 10,
        tenant.failcnt(),
        root.failcnt()
    );
    check(tenant.failcnt() == 0 && root.failcnt() == 0, "a failure escaped the limited group")?;

    let pages = KMEM.shrink();
    kprintln!(
        "after shrink ({pages} pages back): usage tenant {} B, limited {} B; root {} KiB",
        tenant.usage(),
        limited.usage(),
        root.usage() >> 10
    );
    check(tenant.usage() == 0 && limited.usage() == 0, "a group's usage did not return to zero")?;
    tenant.remove().map_err(|_| "remove(tenant)")?;
    limited.remove().map_err(|_| "remove(limited)")?;
    check(tenant.is_removed() && limited.is_removed(), "groups removed")?;
    check(KMEM.stats().bad_frees == 0, "kmemcg saw frees of pointers it does not own")?;
    Ok(())
}
