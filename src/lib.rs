//! kmemcg: an embeddable `#![no_std]` slab allocator with cgroup-style
//! memory accounting.
//!
//! `Kmem` serves objects from slab caches over a pluggable page source,
//! with per-CPU magazines in front of node-local slabs, and charges slab
//! pages to a lock-free hierarchical counter tree of groups with hard
//! limits. It is usable as a `#[global_allocator]`, as an
//! [`allocator_api2::alloc::Allocator`] (per group too), through named
//! typed caches, and through [`Cgroup`] handles.
//!
//! ```no_run
//! use kmemcg::{Kmem, OsPages};
//! #[global_allocator]
//! static KMEM: Kmem = Kmem::new(OsPages::new());
//! fn main() {
//!     let tenant = KMEM.root().create_child("tenant-a").unwrap();
//!     tenant.set_max(64 << 20).unwrap();
//!     {
//!         let _in = tenant.enter(); // allocations on this thread charge tenant-a
//!         let v: Vec<u32> = (0..1000).collect();
//!         assert_eq!(v.len(), 1000);
//!     }
//!     println!("{}", tenant.stat());
//!     println!("{}", KMEM.slabinfo());
//! }
//! ```
//!
//! # Glossary
//!
//! * **page**: 4 KiB, the unit every layer counts in ([`PAGE_SIZE`]).
//! * **run**: `2^order` contiguous pages, aligned to their size, from a
//!   [`PageSource`]; large objects get *exact* runs whose unused tail pages
//!   go straight back, plus a header page naming the group charged.
//! * **node**: a NUMA node; page sources tag runs with one, and caches keep
//!   slab lists and depots per node.
//! * **slab**: a run cut into equal objects, with a header at its start
//!   naming its cache and holding a bitmap of its free objects (in the
//!   header's cache line for slabs of up to 192 objects); the slab of an
//!   object is found by masking its address. Free objects hold nothing the
//!   allocator reads. A cache's *slab order* is capped by the memory of a
//!   fixed page source (a slab is at most an eighth of a [`Region`]'s
//!   pages), chosen at the allocator's first use
//!   ([`Kmem::with_max_slab_order`]); a capped slab is *exact*: the pages
//!   of its run past its last object go back to the source.
//! * **cache**: the slabs of one object size and alignment: a size class of
//!   the general heap, or a named typed cache ([`Kmem::create_cache`]); an
//!   accounted cache has one *charged cache*, made at first use and
//!   named by the cache itself (so a group's hit finds it with one load),
//!   that serves every group's objects of it from shared slabs (see
//!   *Charging* below).
//! * **size class**: one of 43 object sizes from 8 B to 16 KiB, spaced so a
//!   request wastes at most 25% of its class.
//! * **magazine**: a small stack of free objects of one cache; each CPU
//!   slot has a *loaded* and a *previous* one per cache (Bonwick), in a
//!   cache line of its own that also holds the loaded one's top, floor and
//!   ceiling, so a hit touches that line and one round. The fast paths
//!   address a slot's magazines (and its byte stock) through a register
//!   formed for them, at a displacement from it: on Intel cores a load of
//!   `top` addressed with the slot's offset as an index register, reading
//!   the previous operation's store, took twice as long (BENCHMARKS.md,
//!   *Session 30*).
//! * **depot**: per node and cache, the spare full and empty magazines.
//! * **group**: a node of the cgroup tree ([`Cgroup`]); the root is the
//!   whole allocator.
//! * **charge**: pages added to a group's counter and to all its
//!   ancestors' when a large object is made, or, for the objects of
//!   accounted caches, bytes charged to the group (in whole pages of its
//!   counter, below the root) when the object is allocated; *uncharge*
//!   when it is freed, always from the group that owns it. The root's
//!   counter counts slabs as pages (see *Charging*).
//! * **stock**: pages pre-charged per CPU slot, so most slab grows skip the
//!   shared counters ([`STOCK_MAX`] per slot and counter); and per slot,
//!   bytes charged to one group beyond its objects, so most object charges
//!   touch no shared counter (Linux's `obj_stock`).
//! * **max**: a group's hard limit: a charge that would take it (or an
//!   ancestor) past it reclaims the group's subtree, then fails.
//! * **high**: a group's throttling threshold: an allocating task whose
//!   group (or an ancestor) is above it reclaims from that group before
//!   its allocation returns, and if the group stays above it, is delayed
//!   in proportion to the excess ([`Platform::throttle`]; never in atomic
//!   context); nothing fails for it.
//! * **soft**: a group's soft limit, its target under contention: groups
//!   above theirs are reclaimed first, largest excess first.
//! * **low**: soft protection: while a group's usage is within its
//!   *effective* `low`, reclaim on behalf of others (contention, an
//!   ancestor's `max` or `high`, [`Cgroup::reclaim`] of an ancestor) passes
//!   it over as long as it finds unprotected memory; then it takes from it
//!   too (a `low` event).
//! * **min**: hard protection: within its effective `min`, a group is
//!   never reclaimed for others; an allocation fails instead. Only its own
//!   limits (and [`Cgroup::reclaim`] on it) go below it (a `min` event).
//! * **effective protection**: as in Linux cgroup v2, a child of the
//!   group reclaim serves keeps its claim (usage up to its `min` or
//!   `low`); deeper, a child's protection is bounded by its parent's, and
//!   children whose claims overcommit their parent's share it in
//!   proportion to their claims. A child that claims nothing gets nothing.
//! * **event**: `max`, `oom`, `high`, `low` or `min` happening to a group
//!   ([`Event`]): counted in the group alone (`events_local`) and in it
//!   and each ancestor (`events`), as Linux's `memory.events.local` and
//!   `memory.events`, and passed to the allocator's event hook
//!   ([`Kmem::set_event_hook`]), called outside every lock.
//! * **reclaim**: giving back what a group subtree holds unused: its
//!   magazines, empty slabs and stocks, then what its shrinkers free.
//! * **reclaim context**: a shrinker, the event hook or the out-of-memory
//!   handler running (Linux's `PF_MEMALLOC`): its allocations never
//!   reclaim, and a charge a `max` refuses is made anyway, at most
//!   [`RECLAIM_OVERDRAFT`] pages past the `max` of each level, counted in
//!   [`GroupStat::overdrafts`]; the allocation that started the reclaim
//!   still charges within `max` or fails, and the next reclaim of the group
//!   takes the overdraft back. The context's marks are drop guards', so a
//!   callback that panics and unwinds leaves them as they were (through
//!   `GlobalAlloc`, which must not unwind, it aborts instead).
//! * **decay**: the allocator's own periodic reap (once a second with a
//!   clock, [`Decay`]), so idle memory goes back without a `reap()` call.
//! * **detection**: red zones, poison, a quarantine of freed objects and
//!   sampled guard pages, on when asked ([`Detection`]).
//! * **removed group**: no new charges (its tasks charge its nearest
//!   online ancestor); its objects stay charged to it until freed, and it
//!   goes with its last object and handle once the stocks holding its last
//!   bytes are flushed (by another group's use of the slot, a reclaim, a
//!   reap or `shrink`). It holds no cache.
//!
//! # Charging
//!
//! Turns 1-3 charged whole slabs through a *child cache* per group and
//! accounted cache (the 2012 Linux design of the seeds): a group holding
//! one 16-byte object held a slab and per-CPU magazines of its own. 1,000
//! groups each holding one object of 8 sizes (6.1 KB live) kept 26.6x
//! their live bytes in pages, a group needed a `max` of 48 KiB to hold 6
//! KB, and accounted caches were capped at 21. Linux found the same
//! (slab memory 45-65% used) and moved to per-object charging in 5.9
//! (`obj_cgroup`), with separate `kmalloc-cg-*` caches since 5.14.
//!
//! So now, as there: every accounted cache (the size classes and typed
//! caches made with [`CacheFlags::ACCOUNT`]) has one *charged cache*
//! serving every group's objects of it, from slabs all groups share,
//! with an owner word per object ahead of the objects (the group's
//! address; 8 bytes per object, paid by charged slabs only: the root's
//! own objects come from the cache itself, with no owner words, so a
//! program with no group pays nothing). Its slabs have the cache's order,
//! so a free finds either kind of slab by the same mask, and the header
//! names which. A group's object is charged its stride in bytes: through
//! the CPU slot's byte stock (a compare and a subtract under the slot, no
//! atomic), which takes whole pages from the group's counter when it runs
//! short, reclaiming if a limit refuses, as a slab grow does. A free
//! reads the owner word, clears it, and gives the bytes back to the
//! slot's stock; whole pages past a page go back to the counter (a free
//! that displaces another group's stock too), and the displaced stock is
//! flushed into its group's
//! `spare` (see `cgroup::tree::objects` for the invariant and the
//! removal protocol, which loom checks). A removed group's frees use the
//! stock as a live group's do (seed 001: no atomic operation per free);
//! a reap flushes stocks that hold removed groups' bytes.
//!
//! Object charges stop below the root. The root's counter counts what
//! the page source gave to slabs (charged caches included) and large
//! objects: its `max` bounds the memory, and its usage stays physical.
//! A group's usage is its objects' bytes in whole pages, plus what the
//! slots' stocks hold for it (at most a page per slot), plus its large
//! objects and its children's.
//!
//! Trade-offs, measured (`cargo bench --bench tenants`, BENCHMARKS.md):
//! memory in proportion to use (the 1,000-group spread went from 26.6x to
//! the figure there), any number of accounted caches, a group `max` that
//! binds at page granularity of its bytes; against that, an accounted
//! hit does a stock compare and an owner store besides the magazine pop,
//! and a free a slab-header read and an owner load (see `scripts/icount.sh`,
//! `box-group` and `typed-group`: 123 and 105 instructions a pair against
//! 69 and 55 unaccounted; `cargo bench --bench accounting` times a
//! `GlobalAlloc` pair inside a group at about 1.7x one in the root).
//! What would bring that near the unaccounted
//! hit, magazines of objects kept charged to one group per slot, would
//! hold charges for freed objects beyond the stock's page per slot, per
//! cache, and give back the memory rows above; the stock's bound wins.
//!
//! # Layers, bottom to top
//!
//! A module uses only modules below it, and within a layer the sibling
//! modules form no cycle (a module and its own children may use each
//! other); imports are explicit (no globs), so the order can be read off
//! each file's `use` lines, and `.ci/layers.py` checks both rules.
//! [`Error`] is a leaf every layer may name.
//!
//! | layer | module | holds |
//! | --- | --- | --- |
//! | sync | `sync` | the one place naming `core::sync::atomic` or loom |
//! | platform | `platform` | [`PageSource`], [`Region`] (buddy over handed-in memory), `OsPages`; [`Platform`]: CPU slot, node, current group |
//! | counter | `counter` | [`PageCounter`]: charge, try_charge, uncharge, limits, watermark, failcnt, stock |
//! | page | `page` | exact page runs, pointer → slab lookup |
//! | slab | `slab` | caches: grow, shrink, bulk paths, charging slab pages (`slab.rs`); object layout (`geometry`); slab header, free bitmap, per-node lists (`node`); the size classes (`classes`) |
//! | magazine | `magazine` | per-CPU loaded/previous magazines and the fast paths (`magazine.rs`), the slot handshake (`slots`), per-node depots (`depot`), draining (`drain`) |
//! | cgroup | `cgroup` | groups: counters, references, tokens, walks, event counts (`cgroup.rs`); the group tree of one allocator and the whole group lifecycle, with the root's size-class caches, the charged caches (`tree::charged`), objects charged one by one and the slots' byte stocks (`tree::objects`) and the metadata caches (`tree`); the typed-cache registry (`tree::registry`); effective `min`/`low` and what a reclaim pass may take (`tree::protection`); the event hook (`tree::events`); charging with reclaim, `high`, contention, shrinkers, shrink and reap (`tree::reclaim`); pressure resources (`pressure`) |
//! | heap | `heap` | [`Kmem`]: alloc/free/realloc over the tree's caches (`heap.rs`), the page path (`large`), memory-error detection (`debug`), decay (`decay`), reports (`report`), invariant checks (`check`); [`Heap`], the one type parameter of the handles |
//! | handle | `handle` | the public handles: [`Cgroup`], [`CgroupGuard`], [`CgroupAllocator`] (`cgroup`), [`Pressure`] (`pressure`), [`KmemCache`], [`CacheBox`] (`typed`) |
//! | global | `global` | `GlobalAlloc` and `Allocator` for [`Kmem`] and [`CgroupAllocator`] |
//!
//! # Lock order
//!
//! Outer before inner; no path takes them the other way:
//!
//! 0. the first use (`Kmem::settle`), once per allocator: the context that
//!    makes it fits every cache's slab order taking only the page
//!    source's lock (6); any other waits for it at the start of its
//!    operation, before it takes a lock (in interrupt context an
//!    allocation fails instead of waiting);
//! 1. `Tree::registry_lock` (cache creation and destruction; `shrink` and
//!    `reap` try it, to retire caches destroyed while objects of theirs
//!    were on their way back from the quarantine);
//! 2. `Tree::lock`, the tree lock (group creation and removal, pressure
//!    resources, subtree reclaim, group reclamation); shrinkers are called
//!    with no lock held (under a read guard, which is no lock: it only
//!    defers freeing group metadata), and the shrinker list's own lock
//!    only while copying it;
//! 3. a slot's drainer flag (drains only; the slot *holder* takes no lock);
//! 4. a depot lock (one magazine exchange per hold);
//! 5. a cache's per-node list lock (one slab-list update, or one batch of
//!    a magazine refill or flush, per hold);
//! 6. a page source's lock (`Region`: per node; `OsPages`: its pool);
//! 7. detection's quarantine lock, a leaf: objects are linked and
//!    unlinked under it, and checked and freed after it is dropped.
//!    Reclaim and cache destruction give the quarantine back to its caches
//!    (`Env::flush_deferred`) before they take locks 1 and 2; cache
//!    destruction also waits a bounded while for objects another thread
//!    took out to give back (`Env::settle_deferred`).
//!
//! A cache calls its page source and charges its counter *without*
//! holding its list lock when it grows; it releases slabs after dropping
//! it. Counters take no lock at all. Reports read counters under list
//! locks one cache at a time and write to their formatter with no lock
//! held, so a report may be formatted into memory from this allocator.
//! Locks are [`lock_api::RawMutex`] implementations chosen by the user
//! (by default `YieldingRawMutex` with `std`, a spin lock whose waiters
//! yield the CPU after a short spin, since an OS may preempt a holder, and
//! which a waiter cannot starve in: one that has spun out marks itself
//! starving and the next unlock hands the lock to it; and `spin`'s spin
//! lock without). A kernel passes [`IrqSpinLock`] (to `Kmem` and
//! `Region`) with the [`PerCpu`] platform:
//!
//! * every lock masks local interrupts from before it is taken until after
//!   it is released, and a CPU slot is held with them masked too, so an
//!   interrupt handler never runs on a CPU that holds an allocator lock or
//!   its slot: a handler starts with no lock held, and the order above
//!   holds for it as for any context;
//! * so is a slot's drain, from before it takes the slot's drain flag
//!   until after it lets it go (`Platform::mask`): a task that
//!   waits for that flag under the tree lock (a removal, a reclaim) has
//!   interrupts masked, and if the drainer could be preempted between its
//!   lock holds and that task then ran on its CPU, the CPU would hang;
//! * interrupt context (`Cpu::in_interrupt`) allocates atomically: it never
//!   takes locks 1 and 2, never calls shrinkers, and never spins on
//!   anything a task holds while calling out (only on locks 3 to 6, each
//!   held for a bounded step with interrupts masked);
//! * guards are released in reverse order (each restores the interrupt
//!   state from before it), as scoped guards are.
//!
//! # Atomics
//!
//! | field | written by | ordering | paired with |
//! | --- | --- | --- | --- |
//! | `Region::spans[n]` | `Region::add_raw`, after writing the span entry | `Release` | `Acquire` in `Region::node_of` |
//! | `numa`'s node count, `NumaThreads`' `NODES` and `SLOT_NODE[s]` | the first ask (`get_mempolicy`); `init`; a claim of slot `s` | `Relaxed` | nothing for the count (every thread computes the same value); the slot claim's `Acquire` CAS and `init`'s `KEY` for the others (see `threads.rs`) |
//! | `OsPages` page map: leaf pointers | first mapping in a leaf's range, by CAS | `AcqRel` | `Acquire` in `ownership` |
//! | `OsPages` page map: page bits | set after `mmap` and before a run is handed out, cleared before `munmap` | `Release` | `Acquire` in `ownership` (a stray pointer racing an unmap may still read `Owned`) |
//! | `SlotSync::state`, the drain count in `Slots::word` | the slot holder, a drainer | see the slot protocol in `magazine` | Dekker with a light/heavy fence pair; on a try-lock platform the heavy barrier is a take-and-give-back of each slot flag (next row) |
//! | slot flags: `NoCpus::busy`, `PerCpu`'s per-CPU `busy` (without `Cpu::BARRIER`) | the holder's `enter`/`try_enter` (a CAS; for `PerCpu`, with interrupts masked, `lock bts` on x86_64) and `exit`; a drain's `steal`/`unsteal`; the heavy barrier, which takes each flag and gives it back at once | `Acquire` CAS (`AcqRel` in the barrier), `Release` store | each other: one holder at a time, each seeing the magazines as the last left them; a drainer's work before the barrier reaches every later holder, and every earlier holder's writes reach the drainer |
//! | `MagCache::used_slots` | holders on their slow path, drainers | `Relaxed` | ordered by the slot handshake (see the field) |
//! | `PageCounter` fields | charges, `set_max`, stocks | see `counter` | `fence(SeqCst)` pair between `try_charge` and `set_max` |
//! | `Tree::charged[c]`, `CacheDesc::charged` | first use, by CAS | `AcqRel` | `Acquire` on the allocation path |
//! | object stocks (`Stocks`, per slot) | the slot holder; a drainer (removal, reclaim, `shrink`) through the slot handshake | plain, under the slot | the handshake; a holder that puts a group into its stock does `fence(SeqCst)` and rereads the group's state (Dekker with `remove`'s fence before its drain) |
//! | `Group::spare`, `Group::obj_pages` | flushes of stocks (one CAS adds the bytes and takes the whole pages out), charges of whole pages, takes of spare bytes (CAS) | `AcqRel` | each other; a flush reads `spare` only while its bytes still keep the group alive |
//! | owner words (charged slabs) | the object's allocation, then its free | `Relaxed` (`sync::word_store`) | handing the object over; reports scan them under the slab node lock |
//! | `Group::first_child`, `Tree::all_groups` | `create_child`, under the tree lock | `Release` | `Acquire` in walks and reports |
//! | `Tree::registry`, `CacheDesc::next` | `register_cache` (push, after writing the descriptor) and `destroy_cache` (unlink), under `registry_lock` | `Release` | `Acquire` in iterations, which hold a read guard: an unlinked descriptor is freed only once none runs |
//! | `CacheDesc::live` | create/destroy, under `registry_lock` | `Relaxed` | readers under the lock; reports tolerate a stale flag (rows of a cache being destroyed) |
//! | `Group::refs` | handles, guards, a thread's current-group slot, children, object pages (one while `obj_pages` is not zero), large objects | `Relaxed` inc (`try_get` by CAS for walks), `Release` dec, `Acquire` fence at zero | the last `put` hands the group to reclamation |
//! | `Group::next_zombie`, `MagCache::retired_next`, `CacheDesc::retired_next` | the zombie push (before its `Release` CAS), the tree lock's limbo lists | `Relaxed` | the push's `Release` / the swap's `Acquire`, or the tree lock |
//! | `Tree::contention_mark` | `set_contention_mark` | `Relaxed` | nothing: a stale mark delays or adds one contention check |
//! | `Tree::event_hook` | `set_event_hook` | `Release` | `Acquire` before each call: the hook sees what its setter wrote |
//! | `Tree::readers` | read guards (iterations of groups, caches and descriptors; slow frees into charged caches, `Tree::free_uncharged`): `fetch_add`, then `fence(SeqCst)`; `Release` dec | `Relaxed` RMW | `fence(SeqCst)` then `Acquire` load in `reclaim_groups` (Dekker) before anything unlinked is freed |
//! | `Group::visited`, `Tree::episodes` | contention-reclaim episodes | `Relaxed` | nothing: a lost mark costs one visit, within the episode's bound; episode ids need only be unique (an RMW) |
//! | `PageCounter::setting` | limit setters (a spin flag) | `Acquire` CAS, `Release` store | the previous setter's writes to the limits |
//! | platform current-group token | `Cgroup::enter`, guard drops, `reset_current_group` (all through `cgroup::swap_token`), callbacks (the `RECLAIMING`, `IN_HOOK` and `MEMALLOC` bits, set and restored by the `Marks` drop guard) | per context | the slot owns one reference on the group it names (see `cgroup::TokenHead`) |
//! | `TokenHead::state` (a group's) | `remove`, under the tree lock | `Release` | `Acquire` in `is_offline` on the allocation path and in `ShrinkControl::contains` |
//! | `Group::plan` | reclaim planning, under the tree lock | `Relaxed` | read back under the same hold of the lock |
//! | `Group::high_mark` | the `high` throttle (a swap per delay) | `Relaxed` | nothing: concurrent tasks each take the growth they see; it only sizes a delay |
//! | `Tree::zombies` | the last `put` of a group (CAS push) | `Release` | `Acquire` swap in `reclaim_groups` |
//! | the mode bits of `Slots::word` (`cgroup::mode`) | `GROUPS`: `create_child` and `reclaim_groups` under the tree lock, after `all_groups`; `DEBUG`/`ENV`: the first allocation reading `KMEMCG_DEBUG` (or `with_detection`, before any); with sampling alone, `DEBUG` also by the first live sampled object and the free of the last, under the sample table's lock; `INJECT`: `inject_faults`; `BYTES`: `track_bytes` | `Release` RMW | `Relaxed` on the fast paths (as `all_groups` was: `GROUPS` as before; `DEBUG` is fixed before the first object exists, or, with sampling alone, set before a sampled object is handed out and cleared only once none lives: a free of one comes after its allocation, so it sees the bit as a free of a group's object sees `GROUPS`); the special paths re-read it with `Acquire` before reading detection settings |
//! | `Detector` settings | `read_env` before clearing `ENV` | `Relaxed` | ordered by the `Release`/`Acquire` pair on the mode bits |
//! | `Detector::sampled`, `Detector::armed_ms`; `ARMED` in the mode bits | the sampling countdown (per allocation, or on slow paths with sampling alone at one in 256 or rarer) and its arming, at most one a millisecond of the platform clock | `Relaxed` loads and stores; `ARMED` by `Release` RMW | `Relaxed`: racing threads may take the same count or arm in the same millisecond, so a sample comes a little early or late; no safety question rests on them (a sample is ordered by the sample table's lock and `DEBUG`) |
//! | injection table slots | `Table::arm` under the tree lock (rule first, then the group pointer) | `Release` | `Acquire` in `Table::find` |
//! | `Kmem::oom`, `Tree::event_hook` | their setters | `Release` | `Acquire` before the call |
//! | `Kmem::home` | the first use: CAS from 0 to its address with the `SETTLING` bit, then (after fitting every cache's slab order, `Cache::geo`, and `Kmem::slab_cap`) the address | `Acquire` CAS, `Release` store | `Acquire` in `Kmem::settle` before any path reads a geometry; contexts that find `SETTLING` wait (interrupt context fails its allocation instead) |
//! | `Kmem::slab_cap` | construction, the first use | `Relaxed` | ordered by `Kmem::home`'s `Release`/`Acquire` |
//! | `Kmem::last_oom` record | an allocation that finds the page source exhausted (a sequence lock: CAS to odd, fields, even) | `Acquire` CAS, `Relaxed` fields, `Release` store | `Acquire` load, fields, `Acquire` fence, count re-read in `Kmem::last_oom`; a writer that finds it odd skips |
//! | decay `ticks`, `last`, `running` | slow paths; the decaying context (CAS on `running`) | `Relaxed` (ticks: load + store, lost updates only delay), `Acquire`/`Release` on `running` | one decay reap at a time |
//! | `YieldingRawMutex::state` | lockers (CAS from `UNLOCKED`; from `HANDOFF` only by the starving waiter), the holder's unlock | `Acquire` CAS, `Release` store | each other: one holder at a time |
//! | `YieldingRawMutex::starving` | the one waiter that marks itself (CAS), and clears it once it holds the lock | `Acquire` CAS, `Release` clear | `Relaxed` in unlock (a missed mark costs one acquisition's fairness); the next marker's `Acquire` |
//! | `PageCounter::bytes`, `bytes_peak`, `tracks_bytes` | the special paths while `BYTES` is set (RMW up the ancestors; the peak by `fetch_max`), `track_bytes`, `reset_peak` | `Relaxed` | nothing: statistics a test reads after the code it measures |
//! | statistics (`Stat`) | many | `Relaxed` | nothing: never used for a safety decision |
//!
//! # Catching memory bugs
//!
//! [`Kmem::with_detection`] (or `KMEMCG_DEBUG` in the environment) turns on
//! red zones, poison with a quarantine, double- and foreign-free checks
//! and sampled guard pages (see [`Detection`]); a group's
//! [`Cgroup::inject_faults`] fails chosen allocations; [`Cgroup::assert_empty`]
//! and [`Cgroup::assert_peak_at_most`] check a scope's leaks and budget.
//! Off, none of it costs the fast paths anything: they test the mode word
//! they tested before.
//!
//! # Bad input
//!
//! Zero-size layouts, sizes near `isize::MAX`, sizes whose rounding
//! overflows, alignments above a page (served by the page path) and an
//! exhausted page source give null from `GlobalAlloc`, `AllocError` from
//! the `Allocator`, or an [`Error`] from typed APIs, and leave every live
//! object intact. Debug builds check every free: a pointer that no cache
//! owns (null too, which `GlobalAlloc`'s contract rules out and release
//! builds do not test) is ignored and counted in
//! [`KmemStats::bad_frees`]. With feature `hardened`, double frees and
//! foreign frees abort with a message instead. Slabs keep their free objects in a bitmap, not in links inside
//! the objects, so a write after free cannot redirect an allocation in
//! any build, and a double free that reaches a slab is refused there.
//!
//! # Sound from safe code
//!
//! No sequence of safe calls reaches undefined behaviour. Where a public
//! method could break an invariant, it is an `unsafe fn` with a
//! `# Safety` section ([`Platform::set_current_group`], `enter`,
//! `try_enter`, `exit`, `steal` and `unsteal`, reachable through
//! [`Kmem::platform`]; [`PageSource::protect`] and `free_pages`, reachable
//! through [`Kmem::source`]), or it validates its input
//! ([`ShrinkControl::contains`] takes any [`GroupId`], even one of a group
//! freed long ago; `PageSource::claim_pages` checks the pages are free).
//! A `Kmem` may move until its first use; one moved after it stops the
//! program with a message instead of following the addresses its slabs
//! and groups hold (a `static` never moves).
//!
//! ```compile_fail,E0133
//! use kmemcg::{Kmem, OsPages, Platform};
//! static KMEM: Kmem = Kmem::new(OsPages::new());
//! // A made-up token would be followed at the next allocation.
//! KMEM.platform().set_current_group(8 as *const ());
//! ```
//!
//! ```compile_fail,E0133
//! use kmemcg::{Kmem, OsPages, Platform};
//! static KMEM: Kmem = Kmem::new(OsPages::new());
//! // Giving back a slot this thread does not hold.
//! KMEM.platform().unsteal(0);
//! ```
//!
//! ```compile_fail,E0133
//! use kmemcg::{Kmem, OsPages, PageSource};
//! static KMEM: Kmem = Kmem::new(OsPages::new());
//! let v = vec![0u8; 8192];
//! // Would make the pages of a live object inaccessible.
//! KMEM.source().protect(core::ptr::NonNull::from(&v[4096]), 1, true);
//! ```
//!
//! # Pointers and provenance
//!
//! No integer is ever cast to a pointer (Miri runs a subset of the tests
//! with `-Zmiri-strict-provenance`). Addresses are computed as integers
//! for lookups and alignment, and every pointer the allocator forms is
//! derived with `with_addr`/`map_addr` from one that covers the memory: a
//! buddy zone's base pointer (the memory handed to `Region::add`, or an
//! OS mapping), a slab's base (the object it was found from, masked), or
//! a large object's own pointer; a slab hands out objects as its base plus
//! an index from its free bitmap. Group tokens and [`GroupId`]s are
//! pointers. A pointer a caller hands back (a free, a resize) is re-derived
//! from the page source's own provenance before the allocator writes the
//! metadata next to it (`PageSource::rebase`, a no-op outside Miri), and a
//! counter that refused a charge leads back to its group through a pointer
//! stored when the group was made (`Tree::group_of_counter`), not by
//! stepping back from the counter field: both pass Stacked and Tree
//! Borrows. A function that may free what it is handed takes a pointer,
//! not a reference (`Tree::destroy_cache` frees the descriptor of the
//! typed cache being dropped): Stacked Borrows protects a reference
//! argument until the call returns.

#![no_std]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Under loom: helpers only the loom models use, and the parts of the OS
// build of `OsPages` and `Threads` that their loom builds do without.
#![cfg_attr(loom, allow(dead_code))]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

// Loom itself needs std, so a loom build links it whatever the features.
#[cfg(any(feature = "std", test, loom))]
extern crate std;

mod error;
mod sync;
#[cfg(all(test, not(loom)))]
mod testutil;

mod platform;

mod counter;

mod page;

mod slab;

mod magazine;

mod cgroup;

mod heap;

mod handle;

mod global;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests;

/// The `allocator-api2` whose `Allocator` the handles implement (0.2, the
/// version hashbrown and bumpalo take): name the trait through this.
pub use allocator_api2;
/// allocator-api2 0.4, whose `Allocator` the handles also implement
/// (feature `allocator-api2-04`).
#[cfg(feature = "allocator-api2-04")]
#[cfg_attr(docsrs, doc(cfg(feature = "allocator-api2-04")))]
pub use allocator_api2_04;
pub use cgroup::{
    Event, EventHook, FailRule, FaultInjection, GroupId, HIGH_DELAY_BATCH, HIGH_DELAY_MAX_NS, HIGH_DELAY_MIN_NS,
    HIGH_DELAY_NS, RECLAIM_OVERDRAFT, ShrinkControl, Shrinker,
};
pub use counter::{PageCounter, PressureCounter, PressureState, STOCK_BATCH, STOCK_MAX, Thresholds};
pub use error::{Error, GroupName, NAME_MAX};
pub use handle::{
    AtomicScope, CacheBox, CacheFlags, Cgroup, CgroupAllocator, CgroupGuard, EventCounts, GroupStat, KmemCache,
    Pressure,
};
pub use heap::{Decay, Detection, GUARDED_MAX, Heap, Kmem, KmemStats, OomHandler, OomReport, OomSite, SlabInfo};
pub use magazine::{MagazineStats, SlotStats};
#[cfg(feature = "std")]
#[cfg_attr(docsrs, doc(cfg(feature = "std")))]
pub use platform::OsPages;
pub use platform::{
    Cpu, DefaultPlatform, DefaultRawMutex, DefaultSource, FIRST_REGION_PAGES, IrqSpinLock, MAX_CPUS, MAX_NODES,
    MAX_ORDER, NoCpus, Ownership, PAGE_SHIFT, PAGE_SIZE, PageRun, PageSource, PerCpu, Platform, Region, RegionError,
    SourceStats, arch, cpu_for_slot, order_for_pages, slot_for_cpu,
};
#[cfg(feature = "std")]
#[cfg_attr(docsrs, doc(cfg(feature = "std")))]
pub use platform::{NumaThreads, Rseq, Threads};
pub use slab::CacheStats;
pub use slab::classes::MAX_CLASS_SIZE;
#[cfg(loom)]
pub use sync::LoomRawMutex;
#[cfg(all(feature = "std", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "std")))]
pub use sync::YieldingRawMutex;
