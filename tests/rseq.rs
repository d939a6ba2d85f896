//! The `Rseq` platform under threads: per-CPU slots held through
//! restartable sequences, with migrations forced by `sched_setaffinity`
//! (also in the middle of a hold) and drains racing holders.
//!
//! * `holds_exclude_each_other`: threads hold slots as the allocator does
//!   (`try_enter`/`enter` ... `exit`) while drainers `steal` them; a
//!   shadow owner per slot must be free at every hold and steal.
//! * `magazine_memory_follows_cpus`: after 100 threads, the pages a `Kmem`
//!   on `Rseq` keeps and the slots it used, against one on `Threads`.
//! * `objects_are_handed_out_once`: a `Kmem` on `Rseq` (not the global
//!   allocator, so the harness's allocations stay out of it) serves
//!   threads that allocate, fill, check and free objects, hand some to
//!   other threads to free, migrate, and race a thread that reaps and
//!   shrinks; a shadow set of live addresses must never see one twice, and
//!   every object's fill must survive until its free.
//! * `groups_charge_exactly_on_rseq`: threads of two groups allocate,
//!   migrate, free each other's objects, one group removed meanwhile;
//!   charges cover the live bytes and none is left after.
//!
//! On a host without rseq (or glibc without its registration) `Rseq`
//! falls back to `Threads`, and the tests check that instead.

use std::alloc::{GlobalAlloc, Layout};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use kmemcg::{DefaultRawMutex, Kmem, MAX_CPUS, OsPages, Platform, Rseq};

unsafe extern "C" {
    fn sched_setaffinity(pid: i32, size: usize, mask: *const u64) -> i32;
    fn sched_getaffinity(pid: i32, size: usize, mask: *mut u64) -> i32;
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    let mut mask = [0u64; 16];
    // SAFETY: a valid out-buffer of the size passed.
    let r = unsafe { sched_getaffinity(0, size_of_val(&mask), mask.as_mut_ptr()) };
    assert_eq!(r, 0, "sched_getaffinity");
    (0..1024).filter(|&c| mask[c / 64] >> (c % 64) & 1 == 1).collect()
}

/// Moves the calling thread to `cpu` (ignoring a refusal: the CPU may have
/// gone offline).
fn move_to(cpu: usize) {
    let mut mask = [0u64; 16];
    mask[cpu / 64] |= 1 << (cpu % 64);
    // SAFETY: a valid mask of the size passed.
    unsafe { sched_setaffinity(0, size_of_val(&mask), mask.as_ptr()) };
}

/// Lets the calling thread run anywhere again.
fn move_anywhere(cpus: &[usize]) {
    let mut mask = [0u64; 16];
    for &c in cpus {
        mask[c / 64] |= 1 << (c % 64);
    }
    // SAFETY: as in `move_to`.
    unsafe { sched_setaffinity(0, size_of_val(&mask), mask.as_ptr()) };
}

/// A small xorshift generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Serialises the racing tests: each has more threads than this host has
/// CPUs, and a reap waits for every preempted holder.
static SERIAL: Mutex<()> = Mutex::new(());

/// How long each racing phase runs.
const RUN: Duration = Duration::from_millis(1500);

#[test]
fn rseq_is_used_on_this_host() {
    // glibc 2.35+ on Linux x86_64 registers rseq; the fallback is checked
    // by the other tests wherever it is not.
    if cfg!(all(target_arch = "x86_64", target_env = "gnu")) && std::env::var_os("KMEMCG_EXPECT_NO_RSEQ").is_none() {
        assert!(Rseq::new().per_cpu(), "rseq per-CPU slots are not in use on this host");
    }
    // SAFETY: this thread holds no slot.
    let slot = unsafe { Rseq::new().enter() };
    if let Some(slot) = slot {
        if Rseq::new().per_cpu() {
            assert!(
                allowed_cpus().contains(&kmemcg::cpu_for_slot(slot)),
                "slot {slot} is not a CPU this thread may run on"
            );
        }
        // SAFETY: entered just above.
        unsafe { Rseq::new().exit(slot) };
    }
}

#[test]
fn holds_exclude_each_other() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let plat = Rseq::new();
    let cpus = allowed_cpus();
    let owners: Vec<AtomicUsize> = (0..MAX_CPUS).map(|_| AtomicUsize::new(0)).collect();
    // Per slot, a plain counter that only its owner increments: a lost
    // update would show a second owner the shadow missed.
    let counts: Vec<AtomicUsize> = (0..MAX_CPUS).map(|_| AtomicUsize::new(0)).collect();
    let held = AtomicUsize::new(0);
    let stolen = AtomicUsize::new(0);
    let migrated_holding = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let holders = 6;
    let drainers = 2;
    let start = Barrier::new(holders + drainers + 1);
    let take = |slot: usize, who: usize| {
        let prev = owners[slot].swap(who, Ordering::AcqRel);
        assert_eq!(prev, 0, "slot {slot} taken by {who} while {prev} had it");
    };
    let give = |slot: usize, who: usize| {
        let c = &counts[slot];
        // Not a read-modify-write: the owner is alone.
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let prev = owners[slot].swap(0, Ordering::AcqRel);
        assert_eq!(prev, who, "slot {slot} given back by {who} while {prev} had it");
    };
    std::thread::scope(|s| {
        for t in 0..holders {
            let (take, give, cpus) = (&take, &give, &cpus);
            let (plat, held, stop, start, migrated_holding) = (&plat, &held, &stop, &start, &migrated_holding);
            s.spawn(move || {
                let who = t + 1;
                let mut rng = Rng(0x9e37_79b9 ^ who as u64);
                start.wait();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    // SAFETY: this thread holds no slot of `plat`.
                    let slot = unsafe { if i.is_multiple_of(2) { plat.try_enter() } else { plat.enter() } };
                    let Some(slot) = slot else { continue };
                    assert!(slot < MAX_CPUS);
                    take(slot, who);
                    held.fetch_add(1, Ordering::Relaxed);
                    if i.is_multiple_of(997) {
                        // Migrate while holding: the lock, not the CPU,
                        // is what the thread holds.
                        move_to(cpus[rng.below(cpus.len())]);
                        migrated_holding.fetch_add(1, Ordering::Relaxed);
                    } else if i.is_multiple_of(61) {
                        std::thread::yield_now();
                    }
                    for _ in 0..rng.below(32) {
                        std::hint::spin_loop();
                    }
                    give(slot, who);
                    // SAFETY: entered above, not exited since.
                    unsafe { plat.exit(slot) };
                    if i.is_multiple_of(1013) {
                        if rng.below(3) == 0 {
                            move_anywhere(cpus);
                        } else {
                            move_to(cpus[rng.below(cpus.len())]);
                        }
                    }
                }
            });
        }
        for d in 0..drainers {
            let (take, give, cpus) = (&take, &give, &cpus);
            let (plat, stolen, stop, start) = (&plat, &stolen, &stop, &start);
            s.spawn(move || {
                let who = 1000 + d;
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    for slot in cpus.iter().filter(|&&c| c < MAX_CPUS).map(|&c| kmemcg::slot_for_cpu(c)) {
                        // SAFETY: a drain's steal, given back below; this
                        // thread holds no slot.
                        if unsafe { plat.steal(slot) } {
                            take(slot, who);
                            stolen.fetch_add(1, Ordering::Relaxed);
                            for _ in 0..64 {
                                std::hint::spin_loop();
                            }
                            give(slot, who);
                            // SAFETY: stolen just above.
                            unsafe { plat.unsteal(slot) };
                        }
                    }
                    std::thread::yield_now();
                }
            });
        }
        start.wait();
        std::thread::sleep(RUN);
        stop.store(true, Ordering::Relaxed);
    });
    let holds = held.load(Ordering::Relaxed);
    let steals = stolen.load(Ordering::Relaxed);
    let total: usize = counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    assert_eq!(total, holds + steals, "a slot's owner-only counter lost updates");
    assert!(holds > 1000, "holders got only {holds} holds");
    assert!(steals > 0, "drainers never stole a slot");
    if plat.per_cpu() {
        assert!(migrated_holding.load(Ordering::Relaxed) > 0);
        for (slot, c) in counts.iter().enumerate() {
            if c.load(Ordering::Relaxed) > 0 {
                assert!(cpus.contains(&kmemcg::cpu_for_slot(slot)), "slot {slot} is no CPU of this process");
            }
        }
    }
    // Every slot is free again: a steal takes each at once.
    for slot in cpus.iter().filter(|&&c| c < MAX_CPUS).map(|&c| kmemcg::slot_for_cpu(c)) {
        // SAFETY: a drain's steal (waiting out the other tests' holds).
        if unsafe { plat.steal(slot) } {
            // SAFETY: stolen just above.
            unsafe { plat.unsteal(slot) };
        } else {
            panic!("slot {slot} was left taken");
        }
    }
}

static KMEM: Kmem<OsPages, DefaultRawMutex, Rseq> = Kmem::with_platform(OsPages::new(), Rseq::new());

/// An object handed out: its address, size and fill byte.
#[derive(Clone, Copy)]
struct Obj {
    addr: usize,
    size: usize,
    fill: u8,
}

/// Fills `o` with its byte.
fn fill(o: Obj) {
    // SAFETY: a live object of `o.size` bytes that this thread owns.
    unsafe { std::ptr::write_bytes(o.addr as *mut u8, o.fill, o.size) };
}

/// Checks `o`'s fill survived.
fn check(o: Obj) {
    // SAFETY: as in `fill`.
    let bytes = unsafe { std::slice::from_raw_parts(o.addr as *const u8, o.size) };
    if let Some(i) = bytes.iter().position(|&b| b != o.fill) {
        panic!("object {:#x} ({} bytes) byte {i} is {:#x}, not {:#x}", o.addr, o.size, bytes[i], o.fill);
    }
}

#[test]
fn objects_are_handed_out_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpus = allowed_cpus();
    let live: Mutex<HashSet<usize>> = Mutex::new(HashSet::new());
    let handoff: Mutex<Vec<Obj>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let served = AtomicUsize::new(0);
    let reaps = AtomicUsize::new(0);
    let workers = 6;
    let start = Barrier::new(workers + 2);
    const SIZES: [usize; 5] = [8, 64, 96, 512, 2048];
    let alloc = |rng: &mut Rng, tag: u8| -> Obj {
        let size = SIZES[rng.below(SIZES.len())];
        let layout = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: a valid, non-zero layout.
        let p = unsafe { KMEM.alloc(layout) };
        assert!(!p.is_null(), "allocation of {size} failed");
        let o = Obj { addr: p as usize, size, fill: tag };
        assert!(live.lock().unwrap().insert(o.addr), "{:#x} handed out twice", o.addr);
        fill(o);
        o
    };
    let free = |o: Obj| {
        check(o);
        assert!(live.lock().unwrap().remove(&o.addr), "{:#x} freed but not live", o.addr);
        // SAFETY: a live object of KMEM, allocated with this layout.
        unsafe { KMEM.dealloc(o.addr as *mut u8, Layout::from_size_align(o.size, 8).unwrap()) };
    };
    std::thread::scope(|s| {
        for t in 0..workers {
            let (alloc, free, cpus) = (&alloc, &free, &cpus);
            let (handoff, stop, start, served) = (&handoff, &stop, &start, &served);
            s.spawn(move || {
                let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ ((t as u64 + 1) * 0x9e37));
                let mut mine: Vec<Obj> = Vec::with_capacity(512);
                let tag = t as u8 + 1;
                start.wait();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    match rng.below(10) {
                        0..=4 if mine.len() < 400 => {
                            mine.push(alloc(&mut rng, tag));
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        5 if !mine.is_empty() => {
                            let o = mine.swap_remove(rng.below(mine.len()));
                            check(o);
                            handoff.lock().unwrap().push(o);
                        }
                        6 => {
                            let o = handoff.lock().unwrap().pop();
                            if let Some(o) = o {
                                free(o);
                            }
                        }
                        _ if !mine.is_empty() => free(mine.swap_remove(rng.below(mine.len()))),
                        _ => {}
                    }
                    if i.is_multiple_of(4099) {
                        move_to(cpus[rng.below(cpus.len())]);
                    } else if i.is_multiple_of(8191) {
                        move_anywhere(cpus);
                    }
                }
                for o in mine {
                    free(o);
                }
            });
        }
        let (stop, start, reaps) = (&stop, &start, &reaps);
        s.spawn(move || {
            start.wait();
            let mut in_reap = Duration::ZERO;
            let mut worst = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                KMEM.reap();
                let d = t0.elapsed();
                in_reap += d;
                worst = worst.max(d);
                if reaps.fetch_add(1, Ordering::Relaxed) % 8 == 0 {
                    KMEM.shrink();
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            eprintln!("in reap {in_reap:?}, worst {worst:?}");
        });
        start.wait();
        let end = Instant::now() + RUN;
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
    });
    for o in handoff.into_inner().unwrap() {
        free(o);
    }
    assert!(live.lock().unwrap().is_empty());
    assert!(served.load(Ordering::Relaxed) > 10_000, "only {} objects served", served.load(Ordering::Relaxed));
    eprintln!("reaps {} served {}", reaps.load(Ordering::Relaxed), served.load(Ordering::Relaxed));
    assert!(reaps.load(Ordering::Relaxed) > 10);
    KMEM.shrink();
    if Rseq::new().per_cpu() {
        // Magazines in proportion to CPUs: only CPUs' slots were used.
        for slot in 0..MAX_CPUS {
            let st = KMEM.slot_stats(slot);
            if st.hits + st.misses > 0 {
                assert!(cpus.contains(&kmemcg::cpu_for_slot(slot)), "slot {slot} is no CPU of this process");
            }
        }
    }
}

static KMEM_THREADS: Kmem<OsPages, DefaultRawMutex, kmemcg::Threads> =
    Kmem::with_platform(OsPages::new(), kmemcg::Threads::new());
static KMEM_CPUS: Kmem<OsPages, DefaultRawMutex, Rseq> = Kmem::with_platform(OsPages::new(), Rseq::new());

/// 100 threads each allocate 300 objects of six sizes and free them, 20
/// times over, through `a`.
fn hundred_threads<A: GlobalAlloc + Sync>(a: &A) {
    std::thread::scope(|s| {
        for _ in 0..100 {
            s.spawn(|| {
                for round in 0..20 {
                    let mut v = Vec::with_capacity(300);
                    for i in 0..300usize {
                        let l = Layout::from_size_align(16 << (i % 6), 8).unwrap();
                        // SAFETY: a valid, non-zero layout.
                        let p = unsafe { a.alloc(l) };
                        assert!(!p.is_null());
                        v.push((p, l));
                    }
                    for (p, l) in v {
                        // SAFETY: allocated above with `l`.
                        unsafe { a.dealloc(p, l) };
                    }
                    if round % 5 == 0 {
                        std::thread::yield_now();
                    }
                }
            });
        }
    });
}

/// Magazine memory follows the CPUs, not the threads: after 100 threads
/// allocated and freed everything, the pages still out of the source
/// (slabs that magazines and depots keep, and the magazines) and the
/// slots used, `Threads` against `Rseq`.
#[test]
fn magazine_memory_follows_cpus() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    hundred_threads(&KMEM_THREADS);
    hundred_threads(&KMEM_CPUS);
    let used = |k: &dyn Fn(usize) -> kmemcg::SlotStats| (0..MAX_CPUS).filter(|&s| k(s).hits + k(s).misses > 0).count();
    let (t, r) = (KMEM_THREADS.stats().source, KMEM_CPUS.stats().source);
    let (ts, rs) = (used(&|s| KMEM_THREADS.slot_stats(s)), used(&|s| KMEM_CPUS.slot_stats(s)));
    eprintln!(
        "Threads: {} pages in use, {ts} slots used; Rseq: {} pages in use, {rs} slots used",
        t.pages_in_use, r.pages_in_use
    );
    if Rseq::new().per_cpu() {
        assert!(rs <= allowed_cpus().len(), "{rs} slots used on {} CPUs", allowed_cpus().len());
        assert!(r.pages_in_use < t.pages_in_use, "Rseq kept {} pages, Threads {}", r.pages_in_use, t.pages_in_use);
    }
}

/// Groups on `Rseq` (their paths are out of line there): a `Kmem` of its
/// own.
static KMEM_GROUPS: Kmem<OsPages, DefaultRawMutex, Rseq> = Kmem::with_platform(OsPages::new(), Rseq::new());

/// Objects charged to groups on `Rseq`: four threads, two per group,
/// allocate sizes from 8 B to 4 KiB inside their group, migrating between
/// CPUs, and hand every other object to a thread of the other group to
/// free; one group is removed while its objects live. Each group is
/// charged at least its live bytes while they live, nothing is left
/// charged once all are freed and the stocks drained, and the removed
/// group's frees still go through.
#[test]
fn groups_charge_exactly_on_rseq() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let k = &KMEM_GROUPS;
    let groups = [k.root().create_child("rseq-a").unwrap(), k.root().create_child("rseq-b").unwrap()];
    let cpus = allowed_cpus();
    let sizes = [8usize, 24, 64, 100, 256, 1000, 2048, 4096];
    let per_thread = 400;
    // Phase 1: each thread allocates in its group; returns its objects.
    let made: Vec<Vec<(usize, usize)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (g, cpus) = (&groups[t % 2], &cpus);
                s.spawn(move || {
                    let _in = g.enter();
                    let mut rng = Rng(0x9e37_79b9 + t as u64);
                    let mut out = Vec::new();
                    for i in 0..per_thread {
                        if i % 50 == 0 {
                            move_to(cpus[rng.below(cpus.len())]);
                        }
                        let size = sizes[rng.below(sizes.len())];
                        let layout = Layout::from_size_align(size, 8).unwrap();
                        // SAFETY: a non-zero-size layout.
                        let p = unsafe { k.alloc(layout) };
                        assert!(!p.is_null());
                        // SAFETY: a fresh block of `size` bytes.
                        unsafe { p.write_bytes(t as u8, size) };
                        out.push((p as usize, size));
                    }
                    move_anywhere(cpus);
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, g) in groups.iter().enumerate() {
        let live: usize = made.iter().skip(i).step_by(2).flatten().map(|&(_, size)| size).sum();
        assert!(g.usage() >= live, "group {i} charged {} for {live} live bytes", g.usage());
    }
    groups[0].remove().unwrap();
    // Phase 2: every thread frees its objects, every other one from a
    // thread of the other group (entered), checking each fill first.
    let (own, other): (Vec<_>, Vec<_>) = made
        .iter()
        .enumerate()
        .flat_map(|(t, objs)| objs.iter().enumerate().map(move |(j, &o)| (t, j, o)))
        .partition(|&(_, j, _)| j % 2 == 0);
    std::thread::scope(|s| {
        for (t, batch) in [(0usize, &own), (1, &other)] {
            let (g, cpus) = (&groups[1], &cpus);
            s.spawn(move || {
                let _in = (t == 1).then(|| g.enter());
                let mut rng = Rng(0x5151 + t as u64);
                for (n, &(owner, _, (p, size))) in batch.iter().enumerate() {
                    if n % 64 == 0 {
                        move_to(cpus[rng.below(cpus.len())]);
                    }
                    let p = p as *mut u8;
                    // SAFETY: a live block of `size` bytes filled with
                    // its thread's byte; freed once with its layout.
                    unsafe {
                        assert!((0..size).all(|i| *p.add(i) == owner as u8), "an object's fill changed");
                        k.dealloc(p, Layout::from_size_align(size, 8).unwrap());
                    }
                }
                move_anywhere(cpus);
            });
        }
    });
    k.shrink();
    assert_eq!(groups[0].usage(), 0, "the removed group is still charged");
    assert_eq!(groups[1].usage(), 0, "the live group is still charged");
}

#[test]
fn a_reap_passes_a_cpu_slot_held_in_an_operation() {
    // A reap waits for nobody (decay runs one inside an allocation): while
    // this thread holds its CPU's slot (as an allocation does, between
    // `enter` and `exit`), another thread's reaps pass that slot over.
    // Before, `Rseq`'s `steal` waited for the lock in every reap (a review
    // found a decay reap, and a forked child, waiting for a holder that
    // was preempted or gone).
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpus = allowed_cpus();
    move_to(cpus[0]);
    let k: &'static Kmem<OsPages, DefaultRawMutex, Rseq> =
        Box::leak(Box::new(Kmem::with_platform(OsPages::new(), Rseq::new())));
    k.set_decay(kmemcg::Decay::OFF);
    let l = Layout::from_size_align(64, 8).unwrap();
    // This CPU's slot (this thread's, in the fallback) holds magazines.
    // SAFETY: valid layout; each block freed once.
    unsafe {
        let blocks: Vec<*mut u8> = (0..200).map(|_| k.alloc(l)).collect();
        for p in blocks {
            assert!(!p.is_null());
            k.dealloc(p, l);
        }
    }
    let slot = (0..10_000)
        .find_map(|_| {
            // SAFETY: this thread holds no slot; `exit` below.
            let s = unsafe { Rseq::new().enter() };
            if s.is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
            s
        })
        .expect("this thread's slot");
    let (tx, rx) = std::sync::mpsc::channel();
    let reaper = std::thread::spawn(move || {
        k.reap();
        k.reap();
        tx.send(()).unwrap();
    });
    let passed = rx.recv_timeout(Duration::from_secs(10)).is_ok();
    // SAFETY: entered above.
    unsafe { Rseq::new().exit(slot) };
    reaper.join().unwrap();
    move_anywhere(&cpus);
    assert!(passed, "a reap waited for a slot held in an operation");
    // The hold is over: the next reaps take the magazines back.
    k.reap();
    k.reap();
    k.shrink();
    assert_eq!(k.stats().source.pages_in_use, 0, "pages left after the hold ended");
}
