//! A model-based test of group accounting through the public API: random
//! programs over a tree of up to 12 live groups (depth up to 4) that
//! create children, remove groups (refused with `Busy` exactly while a
//! group has live children; accepted with objects still charged to it),
//! set `max` (also below the usage), `high`, and in some programs `min`
//! and `low`, and allocate and free objects of 8 B to 64 KiB (size classes
//! and the page path) in a group: through `GlobalAlloc` inside `enter()`,
//! through the group's `CgroupAllocator`, and through accounted typed
//! caches (`alloc` inside `enter()`, `alloc_in`), also through the handle
//! of a removed group (which charges its nearest live ancestor). A shadow
//! keeps each live object's charge and the group it was charged to; a
//! removed group stays in the shadow's tree, so its ancestors carry its
//! objects until they are freed.
//!
//! What a group's counter holds, read from `cgroup::tree::objects` and
//! `heap::large`: an object of a size class is charged its class size in
//! bytes, a group's object bytes reach its counter in whole pages through
//! the slot's byte stock (pages = ceil((object bytes + stocked bytes) /
//! page), the remainder being the group's `spare`, under a page), a large
//! object is charged its pages plus a header page, and a group's usage
//! adds its children's (removed ones included). Group counters take no
//! page stock (slabs are charged to the root). So, for every group `g`
//! with `base(g)` = the sum over its subtree of its object bytes rounded
//! up to pages plus its large pages:
//!
//! * `base(g) <= usage(g) <= base(g) + STOCK_SLACK` (a page: what the
//!   slot's byte stock may hold), and `usage <= max`;
//! * one thread, one slot, one stock: at most one group holds anything
//!   beyond its subtree's objects and its children's excess, and a group
//!   just removed holds nothing so (removal drains its stock);
//! * a reclaim (a refused charge, `set_max` below the usage) drains every
//!   stock unless protection holds it back, so in programs without `min`
//!   and `low` a charge of `p` pages fails exactly when some ancestor `a`
//!   has `base(a) + p` pages over its `max` (it may also succeed from the
//!   stock or the spare), named by the `oom` event (and by the typed
//!   error), and leaves every group at `base`; `set_max(v)` succeeds
//!   exactly when `base <= v` (in pages), and its error carries `base`.
//!   With protection the bounds get the stock's slack.
//! * a failure with no limit refusing it is the page source running dry,
//!   which only the `Region` programs (1 MiB) may see.
//!
//! At the end every object is freed and every group removed (children
//! first): each group's usage goes to 0 (`check_empty`), the `oom` events
//! match the failures the model saw, the root's usage is what it was at
//! the start, and after `shrink()` so are the source's pages in use.

#[path = "support/rng.rs"]
mod rng;

use std::alloc::{GlobalAlloc, Layout};
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use allocator_api2::alloc::Allocator;
use kmemcg::{
    CacheBox, CacheFlags, Cgroup, Detection, Error, Kmem, KmemCache, MAX_CLASS_SIZE, OsPages, PAGE_SIZE, PageSource,
    Region,
};
use rng::Rng;

/// The size classes (`slab::classes::CLASS_SIZES`): a request of `size`
/// bytes aligned to 8 gets the smallest class of at least `size` rounded
/// up to 8.
const CLASS_SIZES: [usize; 43] = [
    8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896,
    1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 14336, 16384,
];

/// The alignment of the raw blocks.
const ALIGN: usize = 8;

/// The most the groups' usage may exceed the pages their objects need:
/// what the slot's byte stock holds (these programs run on one thread, so
/// one slot, whose stock holds one group's bytes), at most a page (crate
/// docs, *Charging*; `Cgroup::remove`): a stock that takes bytes keeps
/// what it holds past a whole page, and one displaced is flushed (as is
/// what a free larger than a page brings past one: see
/// [`a_removed_groups_last_free_leaves_at_most_a_page`]).
const STOCK_SLACK: usize = PAGE_SIZE;

const MAX_LIVE_GROUPS: usize = 12;
const MAX_DEPTH: usize = 4;

/// What one object charges its group.
#[derive(Clone, Copy, Debug)]
enum Charge {
    /// A size-class object: its class size, in bytes.
    Bytes(usize),
    /// A large object: its pages and its header page.
    Pages(usize),
}

impl Charge {
    /// The pages a charge of it asks the counters for when the stock and
    /// the spare cannot serve it.
    fn pages(self) -> usize {
        match self {
            Charge::Bytes(n) => n.div_ceil(PAGE_SIZE),
            Charge::Pages(p) => p,
        }
    }
}

/// The charge of a raw block of `size` bytes aligned to [`ALIGN`].
fn raw_charge(size: usize) -> Charge {
    if size <= MAX_CLASS_SIZE {
        let r = size.next_multiple_of(ALIGN);
        Charge::Bytes(*CLASS_SIZES.iter().find(|&&c| c >= r).unwrap())
    } else {
        Charge::Pages(size.div_ceil(PAGE_SIZE) + 1)
    }
}

/// The charge of a typed cache's object: `T`'s size (at least a word)
/// rounded up to its alignment (64 with `HWCACHE_ALIGN`).
fn typed_charge<T>(hw: bool) -> Charge {
    let align = if hw { std::mem::align_of::<T>().max(64) } else { std::mem::align_of::<T>() };
    Charge::Bytes(std::mem::size_of::<T>().max(8).next_multiple_of(align))
}

/// A size in `8..=65536`: mostly small, some up to the largest class, some
/// on the page path.
fn random_size(rng: &mut Rng) -> usize {
    match rng.below(100) {
        0..=49 => 8 + rng.below(249) as usize,
        50..=74 => 8 + rng.below(4089) as usize,
        75..=89 => 8 + rng.below(MAX_CLASS_SIZE as u64 - 7) as usize,
        _ => MAX_CLASS_SIZE + 1 + rng.below((64 << 10) - MAX_CLASS_SIZE as u64) as usize,
    }
}

type Words = [u64; 3];
type Bytes200 = [u8; 200];
type Wide = [u64; 130];
type Line = [u32; 5];

/// The accounted typed caches of a program.
struct Caches<'k, S: PageSource + 'static> {
    words: KmemCache<'k, Words, Kmem<S>>,
    bytes: KmemCache<'k, Bytes200, Kmem<S>>,
    wide: KmemCache<'k, Wide, Kmem<S>>,
    line: KmemCache<'k, Line, Kmem<S>>,
}

/// A live object: a raw block (its first and last words hold its tag) or
/// a typed box (holding its tag).
enum Payload<'c, S: PageSource + 'static> {
    Raw { addr: usize, layout: Layout },
    Words(CacheBox<'c, Words, Kmem<S>>),
    Bytes(CacheBox<'c, Bytes200, Kmem<S>>),
    Wide(CacheBox<'c, Wide, Kmem<S>>),
    Line(CacheBox<'c, Line, Kmem<S>>),
}

struct Obj<'c, S: PageSource + 'static> {
    p: Payload<'c, S>,
    /// The entry charged (0: the root, not modelled).
    group: usize,
    charge: Charge,
    tag: u64,
}

/// A group of the shadow tree; entries stay after removal (their objects
/// still count in their ancestors), index 0 is the root.
struct Entry<S: PageSource + 'static> {
    /// The handle; dropped once a removed group's subtree holds nothing.
    h: Option<Cgroup<'static, Kmem<S>>>,
    name: String,
    parent: usize,
    depth: usize,
    live: bool,
    live_children: usize,
    /// Class bytes of the live objects charged to the group itself.
    obj_bytes: usize,
    /// Pages of its live large objects (header pages included).
    large_pages: usize,
    /// Its `max` in bytes, a whole number of pages (`usize::MAX`: none).
    max: usize,
    /// `oom` events counted in the group alone.
    oom: usize,
}

impl<S: PageSource + 'static> Entry<S> {
    /// A live group with no limit and nothing charged yet.
    fn new(h: Cgroup<'static, Kmem<S>>, name: String, parent: usize, depth: usize) -> Self {
        Entry {
            h: Some(h),
            name,
            parent,
            depth,
            live: true,
            live_children: 0,
            obj_bytes: 0,
            large_pages: 0,
            max: usize::MAX,
            oom: 0,
        }
    }
}

/// What the programs did, summed over a test's programs.
#[derive(Default, Debug)]
struct Counts {
    allocs: usize,
    limit_failures: usize,
    source_failures: usize,
    frees: usize,
    frees_of_removed: usize,
    via_removed: usize,
    creates: usize,
    removes: usize,
    busy: usize,
    removed_with_objects: usize,
    set_max_ok: usize,
    set_max_below: usize,
    typed: usize,
    large: usize,
}

struct Model<'c, S: PageSource + 'static> {
    k: &'static Kmem<S>,
    groups: Vec<Entry<S>>,
    objs: Vec<Obj<'c, S>>,
    /// Whether some group has `min` or `low`: reclaim may then leave a
    /// stock in place, and the limit rules get its slack.
    protected: bool,
    region: bool,
    next_name: usize,
    next_tag: u64,
    seed: u64,
    step: u32,
}

impl<'c, S: PageSource + 'static> Model<'c, S> {
    fn handle(&self, i: usize) -> &Cgroup<'static, Kmem<S>> {
        self.groups[i].h.as_ref().expect("a handle")
    }

    /// The nearest live group at or above `i`.
    fn effective(&self, mut i: usize) -> usize {
        while !self.groups[i].live {
            i = self.groups[i].parent;
        }
        i
    }

    /// `i` and its ancestors below the root.
    fn chain(&self, mut i: usize) -> Vec<usize> {
        let mut v = Vec::new();
        while i != 0 {
            v.push(i);
            i = self.groups[i].parent;
        }
        v
    }

    /// `base` of every entry: the pages its subtree's objects need, in
    /// bytes (see the module docs).
    fn bases(&self) -> Vec<usize> {
        let mut base = vec![0usize; self.groups.len()];
        for (j, e) in self.groups.iter().enumerate().skip(1) {
            let own = e.obj_bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE + e.large_pages * PAGE_SIZE;
            if own == 0 {
                continue;
            }
            let mut i = j;
            while i != 0 {
                base[i] += own;
                i = self.groups[i].parent;
            }
        }
        base
    }

    /// Whether `j` is `i` or below it.
    fn within(&self, mut j: usize, i: usize) -> bool {
        while j != 0 {
            if j == i {
                return true;
            }
            j = self.groups[j].parent;
        }
        false
    }

    /// What the stock may hold beyond its groups' objects, for the subtree
    /// of `i` (0: for all groups): a page, whatever was freed last.
    fn slack(&self, _i: usize) -> usize {
        STOCK_SLACK
    }

    /// Whether the subtree of `i` holds a live object.
    fn subtree_holds(&self, i: usize) -> bool {
        self.objs.iter().any(|o| self.within(o.group, i))
    }

    /// What each group holds beyond its subtree's objects (`usage - base`)
    /// less its children's: the bytes the slot's stock holds for the group
    /// itself, rounded up to pages (0 for entries without a handle, which
    /// hold nothing).
    fn own_excess(&self, base: &[usize]) -> Vec<isize> {
        let usage: Vec<isize> = (0..self.groups.len())
            .map(|i| match &self.groups[i].h {
                Some(h) if i != 0 => h.usage() as isize - base[i] as isize,
                _ => 0,
            })
            .collect();
        let mut own = usage.clone();
        for (i, e) in self.groups.iter().enumerate().skip(1) {
            if e.parent != 0 {
                own[e.parent] -= usage[i];
            }
        }
        own
    }

    /// The checks after every step.
    fn check(&mut self) {
        let (seed, step) = (self.seed, self.step);
        let base = self.bases();
        for (i, e) in self.groups.iter().enumerate().skip(1) {
            let Some(h) = &e.h else { continue };
            let u = h.usage();
            assert_eq!(h.is_removed(), !e.live, "seed {seed:#x} step {step}: {} removed?", e.name);
            assert_eq!(h.max(), e.max, "seed {seed:#x} step {step}: {}'s max", e.name);
            assert!(u <= e.max, "seed {seed:#x} step {step}: {} uses {u}, over its max {}", e.name, e.max);
            assert!(
                u >= base[i],
                "seed {seed:#x} step {step}: {} uses {u}, below the {} its subtree's objects need",
                e.name,
                base[i]
            );
            assert!(
                u <= base[i] + self.slack(i),
                "seed {seed:#x} step {step}: {} uses {u}, more than the {} its subtree's objects need and a stock",
                e.name,
                base[i]
            );
        }
        // One slot: one stock, holding one group's bytes, so one group at
        // most holds anything beyond its objects, and no more than a stock.
        let own = self.own_excess(&base);
        let holders: Vec<(usize, isize)> = own.iter().copied().enumerate().filter(|&(_, x)| x != 0).collect();
        assert!(
            holders.len() <= 1 && holders.iter().all(|&(_, x)| x > 0 && x as usize <= self.slack(0)),
            "seed {seed:#x} step {step}: groups holding bytes beyond their objects: {:?}",
            holders.iter().map(|&(i, x)| (&self.groups[i].name, x)).collect::<Vec<_>>()
        );
        // A removed group whose subtree holds nothing is let go once no
        // stock holds its bytes (its usage is then 0).
        for i in 1..self.groups.len() {
            let e = &self.groups[i];
            if !e.live && e.h.as_ref().is_some_and(|h| h.usage() == 0) && !self.subtree_holds(i) {
                self.groups[i].h = None;
            }
        }
    }

    /// Checks a failed allocation charged to `e` (live) of `charge`:
    /// exactly one group below the root counted an `oom` event, and the
    /// shadow says the charge would take it over its `max`; or none did,
    /// and the page source ran dry (a `Region` only). Returns the group
    /// that refused it.
    fn failed(&mut self, e: usize, charge: Charge, what: &str, c: &mut Counts) -> Option<usize> {
        let (seed, step) = (self.seed, self.step);
        let base = self.bases();
        let mut refuser = None;
        for a in self.chain(e) {
            let oom = self.handle(a).stat().events_local.oom;
            let was = self.groups[a].oom;
            assert!(oom == was || oom == was + 1, "seed {seed:#x} step {step}: {what}: oom events {was} -> {oom}");
            if oom == was + 1 {
                assert!(refuser.is_none(), "seed {seed:#x} step {step}: {what}: two groups refused one charge");
                refuser = Some(a);
                self.groups[a].oom = oom;
            }
        }
        match refuser {
            Some(a) => {
                c.limit_failures += 1;
                let g = &self.groups[a];
                let slack = if self.protected { self.slack(a) } else { 0 };
                assert!(
                    base[a] + slack + charge.pages() * PAGE_SIZE > g.max,
                    "seed {seed:#x} step {step}: {what} ({charge:?}) refused by {}, whose subtree needs {} of its max {}",
                    g.name,
                    base[a],
                    g.max
                );
                if !self.protected {
                    // The reclaim before the refusal drained every stock:
                    // each group holds what its objects need, no more.
                    for (i, e) in self.groups.iter().enumerate().skip(1) {
                        if let Some(h) = &e.h {
                            assert_eq!(
                                h.usage(),
                                base[i],
                                "seed {seed:#x} step {step}: {what} refused: {}'s usage after the reclaim",
                                e.name
                            );
                        }
                    }
                }
            }
            None => {
                assert!(
                    self.region,
                    "seed {seed:#x} step {step}: {what} ({charge:?}) failed with no limit refusing it"
                );
                c.source_failures += 1;
            }
        }
        refuser
    }

    fn tag(&mut self) -> u64 {
        self.next_tag = self.next_tag.wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.next_tag
    }

    /// A random entry with a handle, live (`live`) or removed.
    fn pick(&self, rng: &mut Rng, live: bool, root: bool) -> Option<usize> {
        let v: Vec<usize> = (if root { 0 } else { 1 }..self.groups.len())
            .filter(|&i| self.groups[i].live == live && self.groups[i].h.is_some())
            .collect();
        (!v.is_empty()).then(|| v[rng.below(v.len() as u64) as usize])
    }

    fn live_groups(&self) -> usize {
        self.groups.iter().skip(1).filter(|e| e.live).count()
    }

    fn create(&mut self, rng: &mut Rng, c: &mut Counts) {
        let Some(p) = self.pick(rng, true, true) else { return };
        if self.live_groups() >= MAX_LIVE_GROUPS || self.groups[p].depth >= MAX_DEPTH {
            return;
        }
        // Now and then a live sibling's name first: refused, nothing made.
        if rng.below(8) == 0
            && let Some(s) = (1..self.groups.len()).find(|&i| self.groups[i].live && self.groups[i].parent == p)
        {
            let name = self.groups[s].name.clone();
            assert_eq!(self.handle(p).create_child(&name).unwrap_err(), Error::NameTaken);
        }
        let name = format!("g{}", self.next_name);
        self.next_name += 1;
        match self.handle(p).create_child(&name) {
            Ok(h) => {
                assert_eq!((h.usage(), h.max(), h.name()), (0, usize::MAX, name.as_str()));
                let depth = self.groups[p].depth + 1;
                self.groups.push(Entry::new(h, name, p, depth));
                self.groups[p].live_children += 1;
                c.creates += 1;
            }
            Err(e) => assert!(self.region && e == Error::OutOfMemory, "create_child: {e:?}"),
        }
    }

    fn remove(&mut self, rng: &mut Rng, c: &mut Counts) {
        if rng.below(16) == 0 {
            assert_eq!(self.handle(0).remove(), Err(Error::RootGroup));
        }
        if rng.below(4) == 0
            && let Some(i) = self.pick(rng, false, false)
        {
            let h = self.handle(i);
            assert_eq!(h.remove(), Err(Error::Removed));
            assert_eq!(h.set_max(1 << 20), Err(Error::Removed));
            assert_eq!(h.set_high(1 << 20), Err(Error::Removed));
            assert_eq!(h.create_child("late").unwrap_err(), Error::Removed);
        }
        let Some(i) = self.pick(rng, true, false) else { return };
        let r = self.handle(i).remove();
        if self.groups[i].live_children > 0 {
            assert_eq!(
                r,
                Err(Error::Busy),
                "seed {:#x} step {}: removing {}",
                self.seed,
                self.step,
                self.groups[i].name
            );
            c.busy += 1;
        } else {
            assert_eq!(r, Ok(()), "seed {:#x} step {}: removing {}", self.seed, self.step, self.groups[i].name);
            self.removed(i);
            c.removes += 1;
            if self.subtree_holds(i) {
                c.removed_with_objects += 1;
            }
        }
    }

    /// Notes that `i` was removed, checking that the removal took back
    /// what the stock held for it.
    fn removed(&mut self, i: usize) {
        let own = self.own_excess(&self.bases())[i];
        let (seed, step, name) = (self.seed, self.step, &self.groups[i].name);
        assert_eq!(own, 0, "seed {seed:#x} step {step}: {name} removed with {own} bytes stocked");
        self.groups[i].live = false;
        let p = self.groups[i].parent;
        self.groups[p].live_children -= 1;
    }

    fn set_max(&mut self, rng: &mut Rng, c: &mut Counts) {
        let Some(i) = self.pick(rng, true, false) else { return };
        let base = self.bases()[i];
        let v = match rng.below(8) {
            0 => usize::MAX,
            1 => base.saturating_sub(rng.below(4 * PAGE_SIZE as u64) as usize),
            2 => rng.below(1 << 20) as usize,
            _ => base + rng.below(256 << 10) as usize,
        };
        let want = if v == usize::MAX { v } else { v / PAGE_SIZE * PAGE_SIZE };
        let (seed, step, name) = (self.seed, self.step, self.groups[i].name.clone());
        let r = self.handle(i).set_max(v);
        // Reclaim drains the stocks (unless protection holds it back), so
        // what stays is `base`.
        let slack = if self.protected { self.slack(i) } else { 0 };
        match r {
            Ok(()) => {
                assert!(base <= want, "seed {seed:#x} step {step}: {name}: max {v} set below the {base} in use");
                self.groups[i].max = want;
                c.set_max_ok += 1;
            }
            Err(Error::LimitBelowUsage { usage }) => {
                assert!(
                    base + slack > want && usage > want && usage >= base && usage <= base + slack,
                    "seed {seed:#x} step {step}: {name}: max {v} refused with usage {usage}, needed {base}"
                );
                c.set_max_below += 1;
            }
            Err(e) => panic!("seed {seed:#x} step {step}: {name}: set_max({v}): {e:?}"),
        }
    }

    fn set_high_or_protection(&mut self, rng: &mut Rng, protect: bool) {
        let Some(i) = self.pick(rng, true, false) else { return };
        let u = self.handle(i).usage();
        let v = match rng.below(3) {
            0 => usize::MAX,
            _ => u / 2 + rng.below((u + (256 << 10)) as u64) as usize,
        };
        if protect && rng.below(2) == 0 {
            self.protected = true;
            let h = self.handle(i);
            let v = if v == usize::MAX { 0 } else { v };
            if rng.below(2) == 0 {
                h.set_min(v).unwrap()
            } else {
                h.set_low(v).unwrap()
            }
            assert_eq!(self.handle(0).set_min(v), Err(Error::RootGroup));
        } else {
            let h = self.handle(i);
            h.set_high(v).unwrap();
            assert_eq!(h.stat().high, if v == usize::MAX { v } else { v / PAGE_SIZE * PAGE_SIZE });
        }
    }

    /// Adds an object charged to entry `g` (0: the root).
    fn add(&mut self, p: Payload<'c, S>, g: usize, charge: Charge, tag: u64) {
        if g != 0 {
            match charge {
                Charge::Bytes(n) => self.groups[g].obj_bytes += n,
                Charge::Pages(n) => self.groups[g].large_pages += n,
            }
        }
        self.objs.push(Obj { p, group: g, charge, tag });
    }

    fn alloc(&mut self, rng: &mut Rng, caches: &'c Caches<'static, S>, c: &mut Counts) {
        // The group asked for: mostly a live one, some removed (charging
        // its nearest live ancestor), a few the root.
        let asked = match rng.below(20) {
            0 => 0,
            1..=2 => self.pick(rng, false, false).unwrap_or(0),
            _ => self.pick(rng, true, false).unwrap_or(0),
        };
        let e = self.effective(asked);
        if !self.groups[asked].live {
            c.via_removed += 1;
        }
        let h = self.handle(asked).clone();
        let tag = self.tag();
        c.allocs += 1;
        if rng.below(4) == 0 {
            // A typed cache: inside `enter()` or with `alloc_in`.
            c.typed += 1;
            let entered = rng.below(2) == 0;
            let (r, charge) = match rng.below(4) {
                0 => (
                    typed(&caches.words, &h, entered, [tag, tag ^ 1, tag ^ 2]).map(Payload::Words),
                    typed_charge::<Words>(false),
                ),
                1 => (
                    typed(&caches.bytes, &h, entered, [tag as u8; 200]).map(Payload::Bytes),
                    typed_charge::<Bytes200>(false),
                ),
                2 => (typed(&caches.wide, &h, entered, [tag; 130]).map(Payload::Wide), typed_charge::<Wide>(false)),
                _ => (typed(&caches.line, &h, entered, [tag as u32; 5]).map(Payload::Line), typed_charge::<Line>(true)),
            };
            match r {
                Ok(p) => self.add(p, e, charge, tag),
                Err(err) if e == 0 => {
                    assert!(self.region && err == Error::OutOfMemory, "a root typed allocation: {err:?}");
                    c.source_failures += 1;
                }
                Err(err) => match (self.failed(e, charge, "typed alloc", c), err) {
                    (Some(a), Error::LimitExceeded { group, max }) => assert_eq!(
                        (group.as_str(), max),
                        (self.groups[a].name.as_str(), self.groups[a].max),
                        "seed {:#x} step {}: the typed error names the group that refused",
                        self.seed,
                        self.step
                    ),
                    (None, Error::OutOfMemory) => {}
                    (a, err) => {
                        panic!("seed {:#x} step {}: typed alloc: {err:?}, refused by {a:?}", self.seed, self.step)
                    }
                },
            }
            return;
        }
        let size = random_size(rng);
        let layout = Layout::from_size_align(size, ALIGN).unwrap();
        let charge = raw_charge(size);
        let p = if rng.below(2) == 0 {
            let _in = h.enter();
            // SAFETY: a layout of non-zero size.
            unsafe { self.k.alloc(layout) }
        } else {
            h.allocator().allocate(layout).map_or(std::ptr::null_mut(), |p| p.cast::<u8>().as_ptr())
        };
        if p.is_null() {
            if e == 0 {
                assert!(self.region, "a root allocation of {size} bytes failed");
                c.source_failures += 1;
            } else {
                self.failed(e, charge, "alloc", c);
            }
            return;
        }
        if let Charge::Pages(_) = charge {
            c.large += 1;
        }
        let addr = p.addr();
        assert!(addr.is_multiple_of(ALIGN));
        // SAFETY: a live block of `size >= 8` bytes, aligned to 8: its
        // first word, and its last if that one is apart from the first.
        unsafe {
            (p as *mut u64).write(tag);
            (p.add(tail_at(size)) as *mut u64).write_unaligned(tag);
        }
        self.add(Payload::Raw { addr, layout }, e, charge, tag);
    }

    fn free(&mut self, rng: &mut Rng, c: &mut Counts) {
        if self.objs.is_empty() {
            return;
        }
        let o = self.objs.swap_remove(rng.below(self.objs.len() as u64) as usize);
        self.free_obj(o, rng, c);
    }

    fn free_obj(&mut self, o: Obj<'c, S>, rng: &mut Rng, c: &mut Counts) {
        let t = o.tag;
        match o.p {
            Payload::Raw { addr, layout } => {
                let p = addr as *mut u8;
                let tail = tail_at(layout.size());
                // SAFETY: the live block, tagged in its first and last
                // words (the first only, if they overlap).
                let (a, b) = unsafe { ((p as *const u64).read(), (p.add(tail) as *const u64).read_unaligned()) };
                assert_eq!((a, b), (t, t), "seed {:#x} step {}: block {addr:#x} corrupted", self.seed, self.step);
                if rng.below(2) == 0 {
                    // SAFETY: the live block, freed once with its layout.
                    unsafe { self.k.dealloc(p, layout) };
                } else {
                    // Any group's allocator frees any block.
                    let g = self.pick(rng, true, true).unwrap_or(0);
                    // SAFETY: as above.
                    unsafe { self.handle(g).allocator().deallocate(NonNull::new(p).unwrap(), layout) };
                }
            }
            Payload::Words(b) => assert_eq!(*b, [t, t ^ 1, t ^ 2]),
            Payload::Bytes(b) => assert_eq!(*b, [t as u8; 200]),
            Payload::Wide(b) => assert_eq!(*b, [t; 130]),
            Payload::Line(b) => assert_eq!(*b, [t as u32; 5]),
        }
        c.frees += 1;
        if o.group != 0 {
            let g = &mut self.groups[o.group];
            if !g.live {
                c.frees_of_removed += 1;
            }
            match o.charge {
                Charge::Bytes(n) => g.obj_bytes -= n,
                Charge::Pages(n) => g.large_pages -= n,
            }
        }
    }
}

/// Where a raw block of `size` bytes holds its second tag: its last word,
/// or its first when the two would overlap.
fn tail_at(size: usize) -> usize {
    if size >= 16 { size - 8 } else { 0 }
}

/// A typed allocation charged to `h`: inside its `enter()` guard, or with
/// `alloc_in`.
fn typed<'c, T, S: PageSource + 'static>(
    cache: &'c KmemCache<'static, T, Kmem<S>>,
    h: &Cgroup<'static, Kmem<S>>,
    entered: bool,
    v: T,
) -> Result<CacheBox<'c, T, Kmem<S>>, Error> {
    if entered {
        let _in = h.enter();
        cache.alloc(v)
    } else {
        cache.alloc_in(h, v)
    }
}

/// One random program of `steps` steps on a fresh `k` (`region`: over a
/// `Region`); `protect`: some groups get `min` and `low`.
fn program<S: PageSource + 'static>(
    k: &'static Kmem<S>,
    region: bool,
    seed: u64,
    steps: u32,
    protect: bool,
    c: &mut Counts,
) {
    let pages_at_start = k.source().stats().pages_in_use;
    let root_at_start = k.root().usage();
    let caches = Caches {
        words: k.create_cache::<Words>("words", CacheFlags::ACCOUNT).unwrap(),
        bytes: k.create_cache::<Bytes200>("bytes200", CacheFlags::ACCOUNT).unwrap(),
        wide: k.create_cache::<Wide>("wide", CacheFlags::ACCOUNT).unwrap(),
        line: k.create_cache::<Line>("line", CacheFlags::ACCOUNT | CacheFlags::HWCACHE_ALIGN).unwrap(),
    };
    run(k, &caches, region, seed, steps, protect, c);
    drop(caches);
    if let Err(st) = k.root().check_empty() {
        panic!("seed {seed:#x}: the root is not empty at the end:\n{st}");
    }
    k.shrink();
    assert_eq!(k.root().usage(), root_at_start, "seed {seed:#x}: the root's usage at the end");
    assert_eq!(k.stats().large_objects, 0, "seed {seed:#x}: large objects left");
    assert_eq!(k.source().stats().pages_in_use, pages_at_start, "seed {seed:#x}: pages in use after shrink");
}

/// The steps of a program, then freeing everything and removing every
/// group (children first), with the checks at the end.
fn run<'c, S: PageSource + 'static>(
    k: &'static Kmem<S>,
    caches: &'c Caches<'static, S>,
    region: bool,
    seed: u64,
    steps: u32,
    protect: bool,
    c: &mut Counts,
) {
    let mut rng = Rng(seed);
    let root = Entry::new(k.root(), "/".into(), 0, 0);
    let mut m: Model<'c, S> = Model {
        k,
        groups: vec![root],
        objs: Vec::new(),
        protected: false,
        region,
        next_name: 0,
        next_tag: seed,
        seed,
        step: 0,
    };
    for step in 0..steps {
        m.step = step;
        // Phases of 300 steps: filling (allocations ahead), then draining.
        let filling = (step / 300) % 2 == 0;
        let op = rng.below(100);
        let (alloc, free) = if filling { (50, 72) } else { (25, 80) };
        if op < alloc {
            m.alloc(&mut rng, caches, c);
        } else if op < free {
            m.free(&mut rng, c);
        } else if op < 87 {
            m.create(&mut rng, c);
        } else if op < 92 {
            m.remove(&mut rng, c);
        } else if op < 97 {
            m.set_max(&mut rng, c);
        } else {
            m.set_high_or_protection(&mut rng, protect);
        }
        m.check();
    }
    m.step = steps;
    // Free everything, in a random order.
    while !m.objs.is_empty() {
        m.free(&mut rng, c);
        m.check();
    }
    // Remove every group, children first.
    while let Some(i) = (1..m.groups.len()).find(|&i| m.groups[i].live && m.groups[i].live_children == 0) {
        assert_eq!(m.handle(i).remove(), Ok(()), "seed {seed:#x}: removing {} at the end", m.groups[i].name);
        m.removed(i);
        m.check();
    }
    for e in m.groups.iter().skip(1) {
        let Some(h) = &e.h else { continue };
        if let Err(st) = h.check_empty() {
            panic!("seed {seed:#x}: {} is not empty at the end:\n{st}", e.name);
        }
        assert_eq!(h.usage(), 0, "seed {seed:#x}: {}'s usage at the end", e.name);
        // Every `oom` event was a failure the model saw.
        assert_eq!(h.stat().events_local.oom, e.oom, "seed {seed:#x}: {}'s oom events", e.name);
    }
}

/// A fresh `Kmem` over `OsPages`, leaked (for `enter`), detection off.
fn os_kmem() -> &'static Kmem<OsPages> {
    Box::leak(Box::new(Kmem::new(OsPages::new()).with_detection(Detection::OFF)))
}

/// A fresh `Kmem` over `bytes` of leaked memory starting on a 64 KiB
/// boundary, detection off.
fn region_kmem(bytes: usize) -> &'static Kmem<Region> {
    let v: &'static mut [MaybeUninit<u8>] =
        Box::leak(vec![MaybeUninit::uninit(); bytes + (1 << 16)].into_boxed_slice());
    let at = v.as_ptr().align_offset(1 << 16);
    let k: &'static Kmem<Region> = Box::leak(Box::new(Kmem::new(Region::new()).with_detection(Detection::OFF)));
    k.source().add(&mut v[at..at + bytes], 0).unwrap();
    k
}

/// Asserts that the programs did what they are for.
fn assert_covered(c: &Counts) {
    assert!(c.limit_failures > 0 && c.set_max_below > 0 && c.set_max_ok > 0, "limits never held: {c:?}");
    assert!(c.busy > 0 && c.removes > 0 && c.removed_with_objects > 0 && c.frees_of_removed > 0, "{c:?}");
    assert!(c.via_removed > 0 && c.typed > 0 && c.large > 0, "{c:?}");
}

fn os_programs(seeds: std::ops::Range<u64>) {
    let mut c = Counts::default();
    for seed in seeds {
        program(os_kmem(), false, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1, 3000, seed % 2 == 1, &mut c);
    }
    assert_covered(&c);
}

fn region_programs(seeds: std::ops::Range<u64>) {
    let mut c = Counts::default();
    for seed in seeds {
        let k = region_kmem(1 << 20);
        program(k, true, seed.wrapping_mul(0x1234_5678_9ABC_DEF1) | 1, 3000, seed % 2 == 1, &mut c);
    }
    assert_covered(&c);
    assert!(c.source_failures > 0, "the region never ran dry: {c:?}");
}

#[test]
fn os_pages_group_programs_a() {
    os_programs(1..9);
}

#[test]
fn os_pages_group_programs_b() {
    os_programs(9..17);
}

#[test]
fn region_group_programs_a() {
    region_programs(1..9);
}

#[test]
fn region_group_programs_b() {
    region_programs(9..17);
}

/// The documented bound on what a stock keeps for a group (a page per
/// slot: crate docs, *Charging*; `Cgroup::remove`) against a free that
/// displaces another group's stock. The freed object's bytes went into
/// the stock whole (`Tree::put_at`), so a removed group whose last object
/// (16 KiB) was freed so kept four pages charged, and itself alive, until
/// the stock was flushed; now the whole pages are flushed at once. Found
/// by the programs above with `STOCK_SLACK` at a page.
#[test]
fn a_removed_groups_last_free_leaves_at_most_a_page() {
    let k = os_kmem();
    let (g, h) = (k.root().create_child("g").unwrap(), k.root().create_child("h").unwrap());
    let (big, small) = (Layout::from_size_align(16384, 8).unwrap(), Layout::from_size_align(8, 8).unwrap());
    let p = {
        let _in = g.enter();
        // SAFETY: a layout of non-zero size.
        unsafe { k.alloc(big) }
    };
    // The slot's stock now holds h's bytes.
    let q = {
        let _in = h.enter();
        // SAFETY: as above.
        unsafe { k.alloc(small) }
    };
    assert!(!p.is_null() && !q.is_null());
    g.remove().unwrap();
    // SAFETY: g's last object, freed once with its layout.
    unsafe { k.dealloc(p, big) };
    assert!(g.usage() <= PAGE_SIZE, "removed, with no object left, g holds {} bytes", g.usage());
    // SAFETY: as above.
    unsafe { k.dealloc(q, small) };
}
