//! Loom models of the magazine layer: the slot handshake, depot exchange,
//! and remote-node frees racing refills.
//!
//! The model platform is not asymmetric, so `try_enter` hands out no slot
//! and every operation runs the slow paths: the same handshake (with a
//! full fence on the holder's side) around the same magazine pops and
//! pushes as the fast paths. The fast paths differ only in that fence,
//! a compiler fence made whole by the drainer's `membarrier`, which loom
//! cannot model. The crate's try-lock platforms (`NoCpus`, and `PerCpu`
//! without `Cpu::BARRIER`) are asymmetric without a `membarrier`: their
//! models run the fast paths, whose compiler fence is nothing under loom
//! (as between threads on the hardware), so the slot flags' `Acquire` and
//! `Release` carry the proof. Each model fails if its platform's heavy
//! barrier does nothing; the `PerCpu` one also if a slot flag is taken or
//! given back `Relaxed`.

use std::cell::Cell;
use std::vec::Vec;

use loom::sync::Arc;
use loom::thread;

use crate::counter::PageCounter;
use crate::magazine::{Acct, DRAINS, Hold, MAGAZINE_GEOMETRY, MagCache, Slots};
use crate::platform::{NoCpus, PAGE_SIZE, PageSource, PerCpu, Platform, Region};
use crate::slab::{Cache, Geometry, Pages};
use crate::sync::LoomRawMutex;

type R = LoomRawMutex;

loom::thread_local! {
    static SLOT: Cell<usize> = Cell::new(usize::MAX);
}

/// Each model thread says which slot it is on; slot `i` is on node
/// `i % nodes`. With `single`, one of the crate's platforms instead, on
/// one node: `NoCpus` (one slot, a try-lock), or `PerCpu` over [`LoomCpu`]
/// (a slot per model thread's CPU, each a try-lock without an all-CPU
/// barrier).
struct LoomCpus {
    nodes: usize,
    single: Option<std::boxed::Box<dyn Platform + Send>>,
    /// `try_enter` hands out the thread's slot (the fast paths' holds run
    /// their handshake, with its fence, as under Miri: the platform is
    /// symmetric); else it hands out none.
    fast: bool,
}

/// The CPU a model thread says it is on ([`set_slot`]); interrupts are
/// not modelled.
struct LoomCpu;

// SAFETY: (1) every model thread that allocates on `PerCpu` sets a
// distinct slot first; (2) no interrupts, so save and restore have
// nothing to do; (3) never in interrupt context; (4) one node; (5) no
// barrier; (6) nothing here allocates.
unsafe impl crate::platform::Cpu for LoomCpu {
    fn id() -> usize {
        SLOT.with(Cell::get)
    }
    fn irq_save() -> usize {
        0
    }
    unsafe fn irq_restore(_saved: usize) {}
}

fn set_slot(slot: usize) {
    SLOT.with(|s| s.set(slot));
}

// SAFETY: (1) every model thread sets a distinct slot (or none) and never
// re-enters; (2) nodes < MAX_NODES; (3) not asymmetric; (4) never steals;
// (5) nothing allocates; (6) groups are not used: always the root. With
// `single`, every method is `NoCpus`'s, which keeps the contract itself.
unsafe impl Platform for LoomCpus {
    fn current_group(&self) -> *const () {
        core::ptr::null()
    }
    unsafe fn set_current_group(&self, _token: *const ()) -> *const () {
        core::ptr::null()
    }
    unsafe fn enter(&self) -> Option<usize> {
        if let Some(one) = &self.single {
            // SAFETY: forwarded.
            return unsafe { one.enter() };
        }
        SLOT.with(|s| {
            let v = s.get();
            (v != usize::MAX).then_some(v)
        })
    }
    unsafe fn try_enter(&self) -> Option<usize> {
        if self.fast {
            // SAFETY: forwarded.
            return unsafe { self.enter() };
        }
        None
    }
    unsafe fn exit(&self, slot: usize) {
        if let Some(one) = &self.single {
            // SAFETY: forwarded.
            unsafe { one.exit(slot) }
        }
    }
    fn node_of(&self, slot: usize) -> usize {
        slot % self.nodes
    }
    fn nodes(&self) -> usize {
        self.nodes
    }
    fn asymmetric(&self) -> bool {
        self.single.as_ref().is_some_and(|one| one.asymmetric())
    }
    fn slots_are_locks(&self) -> bool {
        self.single.as_ref().is_some_and(|one| one.slots_are_locks())
    }
    fn heavy_barrier(&self) {
        if let Some(one) = &self.single {
            one.heavy_barrier()
        }
    }
    unsafe fn steal(&self, slot: usize) -> bool {
        // SAFETY: forwarded.
        self.single.as_ref().is_some_and(|one| unsafe { one.steal(slot) })
    }
    unsafe fn unsteal(&self, slot: usize) {
        if let Some(one) = &self.single {
            // SAFETY: forwarded.
            unsafe { one.unsteal(slot) }
        }
    }
}

struct TestEnv {
    src: Region<R, 2>,
    plat: LoomCpus,
    slots: Slots,
    mags: Cache<R>,
    root: PageCounter,
    /// Backing memory, freed after the region (declared last).
    _mem: Vec<Vec<u8>>,
}

impl TestEnv {
    fn new(nodes: usize) -> TestEnv {
        Self::with_platform(LoomCpus { nodes, single: None, fast: false })
    }

    /// One node and `NoCpus`'s one slot.
    fn single() -> TestEnv {
        Self::with_platform(LoomCpus { nodes: 1, single: Some(std::boxed::Box::new(NoCpus::new())), fast: false })
    }

    /// One node and `PerCpu`'s slots, without an all-CPU barrier.
    fn per_cpu() -> TestEnv {
        Self::with_platform(LoomCpus {
            nodes: 1,
            single: Some(std::boxed::Box::new(PerCpu::<LoomCpu>::new())),
            fast: false,
        })
    }

    fn with_platform(plat: LoomCpus) -> TestEnv {
        let nodes = plat.nodes;
        let src = Region::new();
        let mut mem = Vec::new();
        for node in 0..nodes {
            let mut m = std::vec![0u8; 24 * PAGE_SIZE];
            // SAFETY: the buffer outlives the region (field order) and is
            // used by nothing else.
            unsafe { src.add_raw(m.as_mut_ptr(), m.len(), node) }.unwrap();
            mem.push(m);
        }
        TestEnv {
            src,
            plat,
            slots: Slots::new(),
            mags: Cache::new(MAGAZINE_GEOMETRY),
            root: PageCounter::new_root(),
            _mem: mem,
        }
    }
}

model_env!(TestEnv, LoomCpus, |env| &env.root);

/// A 64-byte cache whose locks have all been taken once: `LoomRawMutex`
/// creates its loom atomic on first use, which must happen before the
/// model's threads are spawned. In one-page slabs (a bounded source's):
/// an 8-page slab's bitmap scans are more loads than loom explores in
/// the depot-exchange model, and the slab's size is not what the models
/// check.
fn cache(env: &TestEnv) -> MagCache<R> {
    let c = MagCache::new(Geometry::smallest(64, 8).unwrap(), Acct::None);
    c.stats();
    env.mags.stats();
    for node in 0..crate::platform::MAX_NODES {
        env.src.free_pages_on(node);
    }
    c
}

/// Allocates `n` objects, tags each with `tag`, checks the tags, frees all.
fn churn(env: &TestEnv, c: &MagCache<R>, n: usize, tag: u8) {
    let mut objs = Vec::new();
    for _ in 0..n {
        let p = c.alloc(env).expect("memory");
        // SAFETY: a fresh 64-byte object.
        unsafe { p.as_ptr().write_bytes(tag, 64) };
        objs.push(p);
    }
    for p in objs {
        // SAFETY: still ours: no other thread may have been handed it.
        let s = unsafe { core::slice::from_raw_parts(p.as_ptr(), 64) };
        assert!(s.iter().all(|&b| b == tag), "object handed to two threads");
        // SAFETY: freed once.
        unsafe { c.free(env, p) };
    }
}

/// After a model: every object is back in a slab and the lists are sound.
fn settle(env: &TestEnv, c: &MagCache<R>) {
    c.drain(env);
    c.cache.check();
    assert_eq!(c.cache.stats().active_objects, 0, "objects lost or duplicated");
    c.cache.shrink(&Pages::plain(&env.src));
    env.mags.shrink(&Pages::plain(&env.src));
    assert_eq!(env.src.stats().pages_in_use, 0, "pages leaked");
}

/// Runs `body` as a loom model on a fresh environment of `nodes` nodes and
/// its 64-byte cache.
fn model(nodes: usize, body: impl Fn(Arc<TestEnv>, Arc<MagCache<R>>) + Sync + Send + 'static) {
    loom::model(move || {
        let env = Arc::new(TestEnv::new(nodes));
        let c = Arc::new(cache(&env));
        body(env, c);
    });
}

#[test]
fn loom_nocpus_one_slot_shared_by_two_threads_and_a_drain() {
    // `NoCpus`: one slot, a try-lock, on the fast paths (it is asymmetric,
    // its heavy barrier a take-and-give-back of the slot). Two threads
    // allocate and free through it (whoever finds it taken goes to the
    // shared path) while a third drains it: no object is handed out twice
    // or lost, and the drain never touches magazines a holder is using.
    loom::model(|| {
        let env = Arc::new(TestEnv::single());
        let c = Arc::new(cache(&env));
        // The slot is used first, so the drain has work that races the
        // threads (without it, loom's bounded schedules had the drain find
        // no used slot, and a heavy barrier that did nothing passed).
        churn(&env, &c, 1, 9);
        let ths: Vec<_> = (0..2)
            .map(|t| {
                let (env, c) = (env.clone(), c.clone());
                thread::spawn(move || churn(&env, &c, 3, t as u8 + 1))
            })
            .collect();
        c.drain(&*env);
        for t in ths {
            t.join().unwrap();
        }
        let one = env.plat.single.as_ref().unwrap();
        // SAFETY: no other thread runs now; given back at once.
        assert!(unsafe { one.steal(0) }, "the slot was left taken");
        // SAFETY: stolen just above.
        unsafe { one.unsteal(0) };
        settle(&env, &c);
    });
}

#[test]
fn loom_percpu_slots_as_try_locks_race_a_drain() {
    // `PerCpu` without `Cpu::BARRIER`: each CPU's slot is a try-lock taken
    // on every hold, and a drain steals an idle slot or, for a busy one,
    // waits out each CPU's operation (its heavy barrier). Both CPUs' slots
    // are used first, so the drain has work on each (as in the `NoCpus`
    // model); then the two CPUs allocate and free more than a magazine
    // holds (refills and spills take the depot lock the drain also takes)
    // while a context on no CPU drains them: no object is handed out twice
    // or lost, the drain never touches magazines a holder is using, and no
    // slot is left taken.
    percpu_cpus_race(5, |env, c| {
        c.drain(env);
    });
}

/// The `PerCpu` models: both CPUs' slots used first (so a drain or reap
/// has work on each), then the two CPUs allocate and free `n` objects
/// each while a context on no CPU runs `drain_or_reap`; at the end no
/// slot is left taken and every object is back.
fn percpu_cpus_race(n: usize, drain_or_reap: impl Fn(&TestEnv, &MagCache<R>) + Sync + Send + 'static) {
    loom::model(move || {
        let env = Arc::new(TestEnv::per_cpu());
        let c = Arc::new(cache(&env));
        for slot in 0..2 {
            set_slot(slot);
            churn(&env, &c, 1, 9);
        }
        set_slot(usize::MAX);
        let ths: Vec<_> =
            (0..2).map(|slot| spawn_on(slot, &env, &c, move |env, c| churn(env, c, n, slot as u8 + 1))).collect();
        drain_or_reap(&env, &c);
        for t in ths {
            t.join().unwrap();
        }
        for slot in 0..2 {
            let p = env.plat.single.as_ref().unwrap();
            // SAFETY: no other thread runs now; given back at once.
            assert!(unsafe { p.steal(slot) }, "slot {slot} was left taken");
            // SAFETY: stolen just above.
            unsafe { p.unsteal(slot) };
        }
        settle(&env, &c);
    });
}

/// Spawns a model thread that takes slot `slot` and runs `f` on the
/// environment and the cache.
fn spawn_on<T: 'static>(
    slot: usize,
    env: &Arc<TestEnv>,
    c: &Arc<MagCache<R>>,
    f: impl FnOnce(&TestEnv, &MagCache<R>) -> T + 'static,
) -> thread::JoinHandle<T> {
    let (env, c) = (env.clone(), c.clone());
    thread::spawn(move || {
        set_slot(slot);
        f(&env, &c)
    })
}

#[test]
fn loom_depot_exchange_between_two_cpus() {
    model(1, |env, c| {
        let ths: Vec<_> = (0..2)
            .map(|slot| {
                spawn_on(slot, &env, &c, move |env, c| {
                    // More than a magazine (4 rounds under loom): refills,
                    // swaps, and depot trades with the other CPU.
                    churn(env, c, 5, slot as u8 + 1);
                    churn(env, c, 3, slot as u8 + 3);
                })
            })
            .collect();
        for t in ths {
            t.join().unwrap();
        }
        settle(&env, &c);
    });
}

/// Spawns the owner of slot 0, which fills its magazine with one round
/// trip, says so, then allocates and frees more (two magazines' worth of
/// holds), and waits until it has said so: a drain or reap that follows
/// has work on the slot, and races the owner's later holds. (Started
/// without the wait, such a model had loom explore one execution: the
/// drain ran first and found no slot used.)
fn owner_with_a_used_slot(env: &Arc<TestEnv>, c: &Arc<MagCache<R>>) -> thread::JoinHandle<()> {
    let ready = Arc::new(loom::sync::atomic::AtomicBool::new(false));
    let said = ready.clone();
    let owner = spawn_on(0, env, c, move |env, c| {
        churn(env, c, 1, 6);
        said.store(true, std::sync::atomic::Ordering::Release);
        churn(env, c, 2, 7);
        churn(env, c, 2, 8);
    });
    while !ready.load(std::sync::atomic::Ordering::Acquire) {
        thread::yield_now();
    }
    owner
}

#[test]
fn loom_slot_drained_while_owner_allocates() {
    model(1, |env, c| {
        let owner = owner_with_a_used_slot(&env, &c);
        // This thread holds no slot: it drains slot 0 through the handshake.
        c.drain(&*env);
        owner.join().unwrap();
        settle(&env, &c);
    });
}

#[test]
fn loom_slot_reaped_while_owner_allocates() {
    // A reap waits for no holder (`reap_slots`, `Slots::try_begin_drain`):
    // it passes over a slot held at the instant it looks, and otherwise
    // drains it while its owner, whose slot counts as idle and whose
    // cache as cold, allocates and frees through it. No object is handed
    // out twice or lost, and the reap never touches magazines a holder is
    // using.
    model(1, |env, c| {
        let owner = owner_with_a_used_slot(&env, &c);
        crate::magazine::reap_slots(&*env, |f| f(&c), &[true; crate::platform::MAX_CPUS]);
        owner.join().unwrap();
        settle(&env, &c);
    });
}

#[test]
fn loom_percpu_slots_reaped_while_cpus_allocate() {
    // As `loom_slot_reaped_while_owner_allocates`, on `PerCpu`'s try-lock
    // slots (both idle, so the reap drains each it can): the reap steals a
    // slot whose lock is free and passes over a taken one; no slot is left
    // taken. Fails if a taken slot is drained anyway.
    percpu_cpus_race(3, |env, c| {
        crate::magazine::reap_slots(env, |f| f(c), &[true; crate::platform::MAX_CPUS]);
    });
}

#[test]
fn loom_remote_free_races_home_refill() {
    model(2, |env, c| {
        // Allocated on the shared path: a node-0 object.
        let x = c.alloc(&*env).unwrap();
        // SAFETY: a live object of `c`.
        assert_eq!(unsafe { c.cache.node_of(x.as_ptr()) }, 0);
        let x = x.as_ptr() as usize;
        let home = spawn_on(0, &env, &c, |env, c| churn(env, c, 3, 5));
        let remote = spawn_on(1, &env, &c, move |env, c| {
            // Node 1 frees a node-0 object: it must go home, not into
            // node 1's magazine.
            // SAFETY: `x` is live and freed once.
            unsafe { c.free(env, core::ptr::NonNull::new(x as *mut u8).unwrap()) };
        });
        home.join().unwrap();
        remote.join().unwrap();
        settle(&env, &c);
    });
}

#[test]
fn loom_three_threads_wait_for_one_lock() {
    // The model lock itself (`LoomRawMutex`): two threads wait for a lock
    // a third holds. As a spin lock that yields, this model had executions
    // of any length (loom switched between the two waiters at every yield,
    // never back to the holder): it exceeded loom's branch limit, and ran
    // for minutes with 100,000 branches. With blocked waiters it is a few
    // hundred executions.
    loom::model(|| {
        let m: Arc<lock_api::Mutex<R, usize>> = Arc::new(lock_api::Mutex::new(0));
        let ths: Vec<_> = (0..2)
            .map(|_| {
                let m = m.clone();
                thread::spawn(move || *m.lock() += 1)
            })
            .collect();
        *m.lock() += 1;
        for t in ths {
            t.join().unwrap();
        }
        assert_eq!(*m.lock(), 3);
    });
}

/// The heap's fast paths' hold (`Slots::try_hold_checked`): one load of
/// the word after the handshake tells the mode bits and the drains. A
/// holder that finds a mode bit and no drain goes on under its hold (as
/// the grouped paths do); one that finds a drain ends the hold and takes
/// the shared path. Here the owner of slot 0 allocates and frees through
/// it while another thread sets a mode bit and this one drains the slot:
/// no object is handed out twice or lost, and the drain never touches
/// magazines a holder is using. Fails if a holder goes on under a hold
/// that saw a drain, or if the drain's count did not reach the holder
/// through the word.
#[test]
fn loom_checked_holds_race_a_drain_and_a_mode_bit() {
    /// A mode bit of the model's (the layers above own the real ones).
    const BIT: usize = 1;
    /// The heap's hold: on under it unless the word shows a drain.
    fn hold_checked(env: &TestEnv) -> Option<usize> {
        match env.slots.try_hold_checked(&env.plat, DRAINS | BIT) {
            Hold::Clear(slot) => Some(slot),
            Hold::Flagged(slot, w) if w & DRAINS == 0 => Some(slot),
            Hold::Flagged(slot, _) => {
                env.slots.unhold(&env.plat, slot);
                None
            }
            Hold::None => None,
        }
    }
    fn alloc_checked(env: &TestEnv, c: &MagCache<R>) -> core::ptr::NonNull<u8> {
        // SAFETY: held, with no drain in progress.
        match hold_checked(env).and_then(|slot| unsafe { c.pop_held(env, slot) }) {
            Some(p) => p,
            None => c.alloc(env).expect("memory"),
        }
    }
    fn free_checked(env: &TestEnv, c: &MagCache<R>, p: core::ptr::NonNull<u8>) {
        // SAFETY: a live object of `c`, freed once; held, with no drain.
        unsafe {
            if !hold_checked(env).is_some_and(|slot| c.push_held(env, slot, p)) {
                c.free(env, p)
            }
        }
    }
    loom::model(|| {
        let env = Arc::new(TestEnv::with_platform(LoomCpus { nodes: 1, single: None, fast: true }));
        let c = Arc::new(cache(&env));
        let ready = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let said = ready.clone();
        let owner = spawn_on(0, &env, &c, move |env, c| {
            churn(env, c, 1, 6);
            said.store(true, std::sync::atomic::Ordering::Release);
            for tag in [7u8, 8] {
                let p = alloc_checked(env, c);
                // SAFETY: a fresh 64-byte object.
                unsafe { p.as_ptr().write_bytes(tag, 64) };
                // SAFETY: still ours.
                let s = unsafe { core::slice::from_raw_parts(p.as_ptr(), 64) };
                assert!(s.iter().all(|&b| b == tag), "object handed to two threads");
                free_checked(env, c, p);
            }
        });
        while !ready.load(std::sync::atomic::Ordering::Acquire) {
            thread::yield_now();
        }
        let setter = {
            let env = env.clone();
            thread::spawn(move || env.slots.set_mode(BIT, true))
        };
        c.drain(&*env);
        owner.join().unwrap();
        setter.join().unwrap();
        assert_eq!(env.slots.mode(), BIT, "the mode bit was lost");
        settle(&env, &c);
    });
}
