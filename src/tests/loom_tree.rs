//! Loom models of the group lifecycle, on the cgroup layer's own code: a
//! [`Tree`] over a model environment, no `Kmem`.
//!
//! The model platform hands out no CPU slot unless a model thread asks
//! for one ([`on_slot`]), so objects mostly go through the locked slab
//! path (the magazine handshake has models of its own in
//! `loom_magazine`); what these models exercise is the tree: creation,
//! charged-cache publication, objects charged one by one and the slots'
//! byte stocks, removal (the stock drain), references, the zombie stack,
//! the read guard and reclamation under the tree lock.
//! A group's memory is poisoned (`Group::is_freed`) just before it is
//! freed, so a walk that reached a freed group fails its assertion.

use std::boxed::Box;
use std::cell::Cell;
use std::vec::Vec;

use loom::sync::Arc;
use loom::thread;

use crate::cgroup::{Group, ShrinkControl, Shrinker, Tree};
use crate::error::Name;
use crate::magazine::{ChargedPop, ChargedPush, MAGAZINE_GEOMETRY, MagCache, Slots};
use crate::platform::{MAX_NODES, PAGE_SIZE, Platform, Region};
use crate::slab::Cache;
use crate::slab::classes::class_of;
use crate::sync::{LoomRawMutex, word_load, word_store};

type R = LoomRawMutex;

loom::thread_local! {
    static TOKEN: Cell<*const ()> = Cell::new(core::ptr::null());
    static SLOT: Cell<usize> = Cell::new(usize::MAX);
}

/// CPU slots only for model threads that ask ([`on_slot`]); each model
/// thread's current group is its own.
struct ModelCpus;

/// Puts the calling model thread on CPU slot `slot` (distinct per thread).
fn on_slot(slot: usize) {
    SLOT.with(|s| s.set(slot));
}

// SAFETY: (1) a slot only for a thread that set a distinct one, which
// never re-enters; (2) node 0; (3) not asymmetric; (4) never steals;
// (5) nothing allocates; (6) the token is a per-thread cell.
unsafe impl Platform for ModelCpus {
    fn current_group(&self) -> *const () {
        TOKEN.with(|t| t.get())
    }
    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        TOKEN.with(|t| t.replace(token))
    }
    unsafe fn enter(&self) -> Option<usize> {
        SLOT.with(|s| {
            let v = s.get();
            (v != usize::MAX).then_some(v)
        })
    }
    unsafe fn exit(&self, _slot: usize) {}
}

/// A tree and what it runs over.
struct TreeEnv {
    src: Region<R, 2>,
    plat: ModelCpus,
    slots: Slots,
    mags: Cache<R>,
    tree: Tree<R>,
    /// Backing memory, freed after the region (declared last).
    _mem: Vec<u8>,
}

model_env!(TreeEnv, ModelCpus, |env| env.tree.root().counter());

/// The size class of the models' 64-byte objects.
fn class() -> usize {
    class_of(64, 8).unwrap()
}

impl TreeEnv {
    fn new() -> TreeEnv {
        let src = Region::new();
        let mut mem = std::vec![0u8; 40 * PAGE_SIZE];
        // SAFETY: the buffer outlives the region (field order) and is used
        // by nothing else.
        unsafe { src.add_raw(mem.as_mut_ptr(), mem.len(), 0) }.unwrap();
        TreeEnv {
            src,
            plat: ModelCpus,
            slots: Slots::new(),
            mags: Cache::new(MAGAZINE_GEOMETRY),
            tree: Tree::new(),
            _mem: mem,
        }
    }

    /// Takes every lock the model's threads may take, once: a
    /// `LoomRawMutex` makes its loom atomic on first use, which must
    /// happen outside the model's threads.
    fn warm(&self, caches: &[&MagCache<R>]) {
        let t = &self.tree;
        for c in [&t.classes()[class()]].into_iter().chain(caches.iter().copied()) {
            c.stats();
        }
        for meta in [&t.groups, &t.charged_caches, &t.descriptors, &t.pressure_nodes, &self.mags] {
            meta.stats();
        }
        for node in 0..MAX_NODES {
            self.src.free_pages_on(node);
        }
        t.touch_locks();
    }

    /// A child of the root; the caller owns one reference on it.
    fn child(&self, name: &str) -> &Group<R> {
        let g = self.tree.create_child(self, self.tree.root(), Name::new_group(name).unwrap()).unwrap();
        // SAFETY: referenced by the caller until its `put_group`.
        unsafe { &*g.as_ptr() }
    }

    /// A child `g` of the root (the caller owns a reference) holding one
    /// live object, whose address comes back too; every lock is warm.
    fn child_with_an_object(&self) -> (&Group<R>, usize) {
        let g = self.child("g");
        let x = self.alloc_in(g);
        self.warm(&[self.tree.class_charged(class()).unwrap()]);
        (g, x)
    }

    /// Drops the caller's reference on `g`, then settles.
    fn put_and_settle(&self, g: &Group<R>) {
        self.tree.put_group(g);
        self.settle();
    }

    /// Removes `g` and drops the caller's reference on it.
    fn remove_and_put(&self, g: &Group<R>) {
        self.tree.remove(self, g).unwrap();
        self.tree.put_group(g);
    }

    /// One 64-byte object charged to `g` (as `Kmem` allocates: to the
    /// nearest online group, from the class's charged cache, the root's
    /// from the class's own).
    fn alloc_in(&self, g: &Group<R>) -> usize {
        let t = &self.tree;
        let base = &t.classes()[class()];
        // SAFETY: null (the root) or a live group of this tree.
        let Some(g) = (unsafe { t.effective(g).as_ref() }) else {
            return base.alloc(self).unwrap().as_ptr() as usize;
        };
        let charged = t.charged_in(self, &base.charged, base).unwrap();
        let n = charged.cache.geometry().size;
        // SAFETY: the closure runs under the hold of `slot`.
        let p = match charged.alloc_fast_charged(self, |slot| unsafe { t.stock_take_at(slot, g, n) }) {
            ChargedPop::Hit(p) => p,
            ChargedPop::Charged => charged.alloc(self).unwrap(),
            ChargedPop::Uncharged => {
                t.charge_object_slow(self, g, n).unwrap();
                charged.alloc(self).unwrap()
            }
        };
        // SAFETY: a fresh object of a charged cache.
        unsafe { word_store(charged.cache.owner_word(p.as_ptr()), g.key()) };
        p.as_ptr() as usize
    }

    /// Frees an object of the class as `Kmem` does: into the cache its
    /// slab names, uncharging its owner first if it was charged.
    fn free(&self, x: usize) {
        let base = &self.tree.classes()[class()];
        let p = core::ptr::NonNull::new(x as *mut u8).unwrap();
        // SAFETY: a live object of the class, in a slab of `base` or of its
        // charged cache (whose header names its `MagCache`).
        let owner = unsafe { &*(base.cache.owner_of(p.as_ptr()) as *const MagCache<R>) };
        let geo = *owner.cache.geometry();
        if geo.has_owners() {
            // SAFETY: a live object of a charged cache.
            let w = unsafe { owner.cache.owner_word(p.as_ptr()) };
            // SAFETY: as above; owner words are accessed only so.
            let key = unsafe { word_load(w) };
            // SAFETY: as above.
            unsafe { word_store(w, core::ptr::null_mut()) };
            // SAFETY: live, freed once; the closure runs under the hold.
            match unsafe { owner.free_fast_charged(self, p, |slot| self.tree.stock_add_at(slot, key, geo.size)) } {
                ChargedPush::Pushed => return,
                ChargedPush::Uncharged => {}
                ChargedPush::Refused(slot) => {
                    // SAFETY: we hold `slot`, and hand it over to the push.
                    if unsafe {
                        self.tree.give_slow_at(slot, key, geo.size);
                        owner.push_held(self, slot, p)
                    } {
                        return;
                    }
                }
                ChargedPush::NoSlot => self.tree.uncharge_object(self, key, geo.size),
            }
            // SAFETY: live, freed once.
            return unsafe { self.tree.free_uncharged(self, owner, p) };
        }
        // SAFETY: live, freed once.
        unsafe { owner.free(self, p) };
    }

    /// After a model: everything is given back, every group but the root
    /// reclaimed, and no charge left anywhere.
    fn settle(&self) {
        let t = &self.tree;
        t.shrink(self);
        assert_eq!(t.groups.stats().active_objects, 0, "a group was never reclaimed (a reference leaked)");
        assert!(t.no_groups(&self.slots), "a reclaimed group is still listed");
        assert_eq!(t.root().counter().usage(), 0, "a charge was lost or kept");
    }
}

/// Stack of the model's threads: a `Tree` (43 size-class caches and the
/// root group) is built on it, beyond loom's default.
const STACK: usize = 16 << 20;

/// Runs `body` as a loom model on a fresh environment (in a model thread
/// with a stack large enough to build it).
fn model(body: impl Fn(Arc<TreeEnv>) + Sync + Send + 'static) {
    let body = std::sync::Arc::new(body);
    let mut builder = loom::model::Builder::new();
    // Setting up and settling a tree takes many steps on one thread.
    builder.max_branches = 100_000;
    builder.check(move || {
        let body = body.clone();
        thread::Builder::new().stack_size(STACK).spawn(move || body(Arc::new(TreeEnv::new()))).unwrap().join().unwrap();
    });
}

/// Spawns a model thread that runs `f` on the environment.
fn spawn<T: Send + 'static>(
    env: &Arc<TreeEnv>,
    f: impl FnOnce(&TreeEnv) -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let env = env.clone();
    thread::Builder::new().stack_size(STACK).spawn(move || f(&env)).unwrap()
}

/// [`spawn`], returning once the thread has started `f`: a model whose
/// main thread races the new one must let it start first, or loom may
/// explore only the executions where the main thread's side ran before
/// the thread existed (one, for `loom_a_removed_groups_free_into_a_stock_races_a_reap`).
fn spawn_started<T: Send + 'static>(
    env: &Arc<TreeEnv>,
    f: impl FnOnce(&TreeEnv) -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let started = Arc::new(loom::sync::atomic::AtomicBool::new(false));
    let said = started.clone();
    let t = spawn(env, move |env| {
        said.store(true, std::sync::atomic::Ordering::Release);
        f(env)
    });
    while !started.load(std::sync::atomic::Ordering::Acquire) {
        thread::yield_now();
    }
    t
}

#[test]
fn loom_remove_races_allocation_in_the_group() {
    // A group is removed while a thread allocates and frees in it: the
    // object comes from the group's cache or, once it is offline, the
    // root's; the charge follows it; the group is reclaimed once its
    // handle's reference and its cache are gone.
    model(|env| {
        let (g, x) = env.child_with_an_object();
        let gp = g as *const Group<R> as usize;
        let allocator = spawn_started(&env, move |env| {
            // SAFETY: the main thread's reference keeps `g` alive until
            // after the join.
            let g = unsafe { &*(gp as *const Group<R>) };
            let y = env.alloc_in(g);
            env.free(y);
        });
        env.tree.remove(&*env, g).unwrap();
        allocator.join().unwrap();
        // The object allocated before the model's threads.
        env.free(x);
        env.put_and_settle(g);
    });
}

#[test]
fn loom_current_group_races_removal() {
    // A thread whose current group is `g` (a child of `p`) allocates for
    // it, as `Kmem` does (`Tree::charged_for` on its token: one compare of
    // the token head's owner word tells "this tree's, online"), while the
    // main thread removes `g`, which sets the word's removed bit. The
    // allocation charges `g` (it ran first) or `p` (it saw the bit, and
    // then `g` offline), never anything else; once the removal is done,
    // `g` takes no new charge.
    model(|env| {
        let p = env.child("p");
        let g = env.tree.create_child(&*env, p, Name::new_group("g").unwrap()).unwrap();
        // SAFETY: referenced by this thread until its `put_group`.
        let g = unsafe { &*g.as_ptr() };
        env.warm(&[]);
        let token = env.tree.token(g) as usize;
        let (gp, pp) = (g as *const Group<R> as usize, p as *const Group<R> as usize);
        let current = spawn_started(&env, move |env| {
            let r = env.tree.charged_for(token as *const ()) as usize;
            assert!(r == gp || r == pp, "charged neither the group nor its parent");
        });
        env.tree.remove(&*env, g).unwrap();
        current.join().unwrap();
        assert_eq!(env.tree.charged_for(token as *const ()) as usize, pp, "a removed group took a charge");
        env.tree.put_group(g);
        env.tree.remove(&*env, p).unwrap();
        env.put_and_settle(p);
    });
}

#[test]
fn loom_remove_races_a_remote_free() {
    // A group is removed while another thread frees an object allocated
    // in it: the object goes back to the (now dead) cache that owns it,
    // the group is uncharged, and it is reclaimed once the last of its
    // objects is gone.
    model(|env| {
        let (g, x) = env.child_with_an_object();
        let remote = spawn_started(&env, move |env| env.free(x));
        env.tree.remove(&*env, g).unwrap();
        remote.join().unwrap();
        env.put_and_settle(g);
    });
}

#[test]
fn loom_last_free_races_reclamation_and_a_walk() {
    // A removed group is kept only by its object's charge, one live
    // object. Its last free (which releases the group onto the zombie
    // stack), a walk of the groups (under a read guard) and reclamation
    // (under the tree lock) race: the walk never reaches freed memory, and
    // the group is freed exactly once.
    model(|env| {
        let (g, x) = env.child_with_an_object();
        env.remove_and_put(g);
        let freer = spawn(&env, move |env| env.free(x));
        let walker = spawn(&env, |env| {
            let mut seen = 0;
            env.tree.for_each_group(|g| {
                assert!(!g.is_freed(), "a walk reached a freed group");
                assert_eq!(g.name().as_str(), "g");
                seen += 1;
            });
            seen
        });
        // Reclamation: groups whose last reference is gone are unlinked,
        // and freed once no walk runs.
        env.tree.finish_reclaim(&*env);
        freer.join().unwrap();
        assert!(walker.join().unwrap() <= 1);
        env.settle();
    });
}

#[test]
fn loom_an_id_lookup_races_the_last_free_and_reclamation() {
    // A shrinker's `ShrinkControl::contains` checks a group id in the id
    // table under its call's read guard, then follows it. A removed
    // group's last free and reclamation race such a lookup: a lookup that
    // finds the id never reaches freed memory (the entry is cleared before
    // reclamation's fence, and the group freed only once no guard is
    // held), and one that runs after reclamation finds nothing.
    model(|env| {
        let (g, x) = env.child_with_an_object();
        let id = env.tree.group_id(g);
        let gp = g as *const Group<R> as usize;
        env.remove_and_put(g);
        let freer = spawn(&env, move |env| env.free(x));
        let looker = spawn(&env, move |env| {
            let _read = env.tree.read_guard();
            // SAFETY: the model's tree outlives its threads.
            let found = unsafe { Tree::<R>::knows(core::ptr::from_ref(&env.tree).cast(), id) };
            if found {
                // SAFETY: found under the guard, so not freed before it drops.
                assert!(!unsafe { &*(gp as *const Group<R>) }.is_freed(), "a found id led to a freed group");
            }
            found
        });
        env.tree.finish_reclaim(&*env);
        freer.join().unwrap();
        looker.join().unwrap();
        env.settle();
        // Reclaimed now: its id names nothing.
        // SAFETY: as above.
        assert!(!unsafe { Tree::<R>::knows(core::ptr::from_ref(&env.tree).cast(), id) });
    });
}

#[test]
fn loom_an_uncharged_free_races_the_release_of_charged_caches() {
    // The last object of the last group is uncharged (its group then goes)
    // before it is freed into its charged cache, as a free without a slot
    // does. A shrink with no group left frees the charged caches once
    // their slabs are gone: it must not free the cache while that free
    // still runs in it (found by a review: the free's uncharge let the
    // group and so the cache go before the free was done).
    model(|env| {
        let (g, x) = env.child_with_an_object();
        env.remove_and_put(g);
        let base = &env.tree.classes()[class()];
        let p = core::ptr::NonNull::new(x as *mut u8).unwrap();
        // SAFETY: a live object of the class's charged cache.
        let owner = unsafe { &*(base.cache.owner_of(p.as_ptr()) as *const MagCache<R>) };
        let size = owner.cache.geometry().size;
        // SAFETY: a live object of a charged cache; owner words are
        // accessed only so.
        let key = unsafe {
            let w = owner.cache.owner_word(p.as_ptr());
            let key = word_load(w);
            word_store(w, core::ptr::null_mut());
            key
        };
        env.tree.uncharge_object(&*env, key, size);
        env.tree.finish_reclaim(&*env);
        assert!(env.tree.no_groups(&env.slots), "the object's charge was the group's last reference");
        let in_free = Arc::new(loom::sync::atomic::AtomicBool::new(true));
        let ptr = p.as_ptr() as usize;
        let flag = in_free.clone();
        let freer = spawn(&env, move |env| {
            let base = &env.tree.classes()[class()];
            let p = core::ptr::NonNull::new(ptr as *mut u8).unwrap();
            // SAFETY: as above: its slab names the charged cache.
            let owner = unsafe { &*(base.cache.owner_of(p.as_ptr()) as *const MagCache<R>) };
            // SAFETY: live, uncharged, freed once. The flag drops once the
            // free is done with the cache.
            unsafe {
                env.tree.free_uncharged_then(env, owner, p, || flag.store(false, loom::sync::atomic::Ordering::SeqCst))
            };
        });
        env.tree.release_charged(&*env);
        let freed = env.tree.charged_caches.stats().active_objects == 0;
        let running = in_free.load(loom::sync::atomic::Ordering::SeqCst);
        assert!(!(freed && running), "the charged cache was freed while a free ran in it");
        freer.join().unwrap();
        env.settle();
        assert_eq!(env.tree.charged_caches.stats().active_objects, 0, "the settling shrink frees the cache");
    });
}

#[test]
fn loom_charged_cache_first_use_race() {
    // Two threads in two groups use a class for the first time at once:
    // one charged cache is published and both get it (the loser frees
    // its own), and each group is charged for its object alone.
    model(|env| {
        let a = env.child("a");
        let b = env.child("b");
        env.warm(&[]);
        let ap = a as *const Group<R> as usize;
        let first_use = move |env: &TreeEnv, g: usize| {
            // SAFETY: the main thread's references keep both groups alive.
            let g = unsafe { &*(g as *const Group<R>) };
            let x = env.alloc_in(g);
            let t = &env.tree;
            (x, t.class_charged(class()).unwrap() as *const MagCache<R> as usize)
        };
        let other = spawn(&env, move |env| first_use(env, ap));
        let (y, mine) = first_use(&env, b as *const Group<R> as usize);
        let (x, theirs) = other.join().unwrap();
        assert_eq!(mine, theirs, "two charged caches were published");
        assert_eq!(env.tree.charged_caches.stats().active_objects, 1, "the loser's cache was not freed");
        assert_eq!((a.counter().usage(), b.counter().usage()), (1, 1), "each group pays for its object");
        env.free(x);
        env.free(y);
        env.remove_and_put(a);
        env.remove_and_put(b);
        env.settle();
    });
}

/// The stock model: warms slot `warm_slot`'s stock and the charged cache
/// (in another group), then a thread on `slot` allocates and frees an
/// object in `g` while the main thread removes `g`.
fn stock_races_removal(warm_slot: usize, slot: usize) {
    model(move |env| {
        let g = env.child("g");
        env.warm(&[]);
        let warmup = spawn(&env, move |env| {
            on_slot(warm_slot);
            let h = env.child("h");
            let x = env.alloc_in(h);
            env.free(x);
            env.remove_and_put(h);
        });
        warmup.join().unwrap();
        let gp = g as *const Group<R> as usize;
        let user = spawn(&env, move |env| {
            on_slot(slot);
            // SAFETY: the main thread's reference keeps `g` alive.
            let g = unsafe { &*(gp as *const Group<R>) };
            let x = env.alloc_in(g);
            env.free(x);
        });
        env.tree.remove(&*env, g).unwrap();
        user.join().unwrap();
        // A free after the removal leaves the bytes in the stock, named for
        // the removed group, until a reap takes them.
        env.tree.drain_dead_stocks(&*env);
        assert_eq!(g.counter().usage(), 0, "a stock kept a removed group's bytes past a reap");
        env.put_and_settle(g);
    });
}

#[test]
fn loom_a_removed_groups_free_into_a_stock_races_a_reap() {
    // `g` is removed with one object live and its handle's reference
    // dropped: only the object's bytes keep it. A thread on slot 0 frees
    // the object (its bytes go into the slot's stock, which then names a
    // removed group) while the main thread takes the stocks of removed
    // groups and reclaims, as a reap does. Whatever the order, the drain
    // follows only a group its stock's bytes keep alive, and once the
    // free is done and one more reap ran, the group is freed (once:
    // `settle` counts) with nothing left charged, before any `shrink`.
    model(|env| {
        let (g, x) = env.child_with_an_object();
        env.remove_and_put(g);
        let freer = spawn_started(&env, move |env| {
            on_slot(0);
            env.free(x);
        });
        env.tree.drain_dead_stocks(&*env);
        env.tree.finish_reclaim(&*env);
        freer.join().unwrap();
        env.tree.drain_dead_stocks(&*env);
        env.tree.finish_reclaim(&*env);
        assert_eq!(env.tree.groups.stats().active_objects, 0, "the removed group outlived its last bytes");
        env.settle();
    });
}

#[test]
fn loom_first_stock_of_a_slot_races_removal() {
    // As `loom_stock_drain_races_removal`, on a slot whose stock was never
    // used: the removal's drain may pass it by (it visits the slots that
    // ever held a stock), so the thread that puts `g` there must see the
    // removal after its full fence and take the stock back.
    stock_races_removal(0, 1);
}

#[test]
fn loom_stock_drain_races_removal() {
    // A thread on a CPU slot allocates an object in `g` (its charge leaves
    // the rest of a page in the slot's stock, for `g`) and frees it (its
    // bytes go back to that stock), while the main thread removes `g`,
    // whose removal takes `g`'s stocks from every slot. Whatever the
    // order, once both are done nothing is charged to `g` (no stock kept
    // its bytes past the removal, which would pin the group), and the
    // group is reclaimed with its last reference.
    stock_races_removal(0, 0);
}

#[test]
fn loom_check_empty_waits_for_a_stock_another_drain_took() {
    // `g`'s freed object left its bytes (a page charged) in slot 0's
    // stock. A reclaim on another thread takes every stock while the main
    // thread checks `g` empty as `Cgroup::check_empty` does: its own drain
    // may find the stock gone, still unflushed; waiting for the stocks in
    // transit, it must find `g` uncharged whatever the order.
    model(|env| {
        on_slot(0);
        let g = env.child("g");
        env.warm(&[]);
        let x = env.alloc_in(g);
        env.free(x);
        assert_eq!(g.counter().usage(), 1, "the stock holds the page's rest");
        let other = spawn(&env, |env| env.tree.drain_all_stocks(env));
        env.tree.drain_all_stocks(&*env);
        assert!(crate::sync::wait_until(|| env.tree.stocks_in_transit() == 0));
        assert_eq!(g.counter().usage(), 0, "a stock in another drain's hands looked charged");
        other.join().unwrap();
        env.remove_and_put(g);
        env.settle();
    });
}

/// A shrinker for the registration model: counts its calls.
struct Counting(std::sync::atomic::AtomicUsize);

impl Shrinker for Counting {
    fn count(&self, _sc: &ShrinkControl) -> usize {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        0
    }
    fn scan(&self, _sc: &ShrinkControl, _nr: usize) -> usize {
        0
    }
}

#[test]
fn loom_shrinker_registration_races_reclaim() {
    // The tree's shrinker list is copied under its lock and called without
    // it: a registration racing a reclaim is either in the copy or not,
    // an unregistration never tears the list, and a reclaim in progress
    // calls only shrinkers that were registered when it copied the list.
    model(|env| {
        let a: &'static Counting = Box::leak(Box::new(Counting(Default::default())));
        let b: &'static Counting = Box::leak(Box::new(Counting(Default::default())));
        env.tree.register_shrinker(&env.src, a).unwrap();
        // Reclaim of a group without caches: the shrinker protocol alone.
        let g = env.child("g");
        env.warm(&[]);
        let reg = spawn(&env, move |env| {
            env.tree.register_shrinker(&env.src, b).unwrap();
            env.tree.unregister_shrinker(a);
        });
        env.tree.reclaim(&*env, g, 1);
        reg.join().unwrap();
        let calls = |s: &Counting| s.0.load(std::sync::atomic::Ordering::Relaxed);
        assert!(calls(a) + calls(b) <= 2, "a shrinker was called twice by one pass");
        // Now only `b` is registered.
        env.tree.reclaim(&*env, g, 1);
        assert!(calls(b) >= 1, "the registered shrinker was not called");
        env.remove_and_put(g);
        env.settle();
    });
}

#[test]
fn loom_reclaim_walk_races_removal_and_reclamation() {
    // A reclaim of p's subtree walks it group by group (a child claims
    // protection) under a read guard alone, as its shrinker rounds do,
    // while another thread frees the last object of a removed child of p
    // and reclaims groups: the walk never reaches freed memory, and the
    // removed child is freed once, after the walk.
    model(|env| {
        let t = &env.tree;
        let p = env.child("p");
        let name = |n: &str| Name::new_group(n).unwrap();
        // SAFETY: referenced by this thread until its puts below.
        let a = unsafe { &*t.create_child(&*env, p, name("a")).unwrap().as_ptr() };
        // SAFETY: as above.
        let b = unsafe { &*t.create_child(&*env, p, name("b")).unwrap().as_ptr() };
        a.counter().set_min(1);
        let x = env.alloc_in(b);
        env.warm(&[env.tree.class_charged(class()).unwrap()]);
        let remover = spawn(&env, move |env| {
            env.free(x);
            env.tree.finish_reclaim(env);
        });
        let pp = p as *const Group<R> as usize;
        let walker = spawn(&env, move |env| {
            let mut seen = 0;
            // SAFETY: p outlives the model's threads (the main thread's
            // reference).
            let p = unsafe { &*(pp as *const Group<R>) };
            env.tree.reclaim_walk(p, |g| {
                assert!(!g.is_freed(), "a reclaim walk reached a freed group");
                seen += 1;
            });
            seen
        });
        env.remove_and_put(b);
        remover.join().unwrap();
        let seen = walker.join().unwrap();
        // p and a, and b if the walk read p's children before b left.
        assert!((2..=3).contains(&seen), "{seen} groups walked");
        env.remove_and_put(a);
        env.remove_and_put(p);
        env.settle();
    });
}
