//! A model-based test of resizing through the public API: random programs
//! of allocations (`GlobalAlloc::alloc`, `Allocator::allocate` and
//! `allocate_zeroed`, zero sizes included), frees, `GlobalAlloc::realloc`
//! and `Allocator::grow`, `grow_zeroed` and `shrink` (whose new layouts
//! may change the alignment, or shrink to nothing), on the root and in a
//! child group with a low `max` (through its `CgroupAllocator` and through
//! `enter()` guards), against a shadow list of the live blocks.
//!
//! After every step: each live block is aligned to its layout, inside the
//! memory handed in (for a `Region`), overlaps no live block, and holds
//! the pattern written into it (a resize keeps the first
//! `min(old, new)` bytes, `grow_zeroed` zeroes the rest of the block, and
//! the usable length `allocate`/`grow` report is at least the request; a
//! resize that fails leaves the old block intact and live); the child's
//! usage stays within its `max`. Blocks from
//! the `Allocator` methods are resized and freed with any size between
//! the request and the usable length, as the trait allows. At the end
//! every block is freed; the child's and the root's usage is back to 0
//! and, after `shrink()`, so are the source's pages in use.
//!
//! The `Region` is small enough that root allocations find it exhausted
//! and the child's `max` low enough that its grows fail: the programs
//! count both and the tests assert that they happened.

#[path = "support/rng.rs"]
mod rng;

use std::alloc::{GlobalAlloc, Layout};
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use allocator_api2::alloc::Allocator;
use kmemcg::{Cgroup, Kmem, OsPages, PageSource, Region};
use rng::Rng;

/// A `Kmem` over `bytes` of leaked memory starting on a 64 KiB boundary,
/// and that memory's extent.
fn region_kmem(bytes: usize) -> (&'static Kmem<Region>, (usize, usize)) {
    let v: &'static mut [MaybeUninit<u8>] =
        Box::leak(vec![MaybeUninit::uninit(); bytes + (1 << 16)].into_boxed_slice());
    let at = v.as_ptr().align_offset(1 << 16);
    let m = &mut v[at..at + bytes];
    let lo = m.as_ptr().addr();
    let k: &'static Kmem<Region> = Box::leak(Box::new(Kmem::new(Region::new())));
    k.source().add(m, 0).unwrap();
    (k, (lo, lo + bytes))
}

/// A live block of the model. Bytes `[0, usable)` hold `pattern(tag)`.
#[derive(Clone, Copy, Debug)]
struct Block {
    addr: usize,
    /// The size asked for: the smallest layout size that fits the block
    /// (the only one for a `GlobalAlloc` block).
    req: usize,
    /// The length reported (`req` for `GlobalAlloc`): the largest layout
    /// size that fits it.
    usable: usize,
    align: usize,
    tag: u8,
}

/// Byte `i` of a block tagged `tag`: position-dependent, so that a copy
/// from the wrong offset shows.
fn pattern(tag: u8) -> [u8; 256] {
    core::array::from_fn(|i| tag ^ i as u8)
}

/// Writes the pattern of `tag` over bytes `[from, to)` of the block at `addr`.
fn fill(addr: usize, from: usize, to: usize, tag: u8) {
    let p = pattern(tag);
    let mut i = from;
    while i < to {
        let n = (256 - i % 256).min(to - i);
        // SAFETY: `[addr + from, addr + to)` is inside a live block of ours
        // (caller); the source is a local array of 256 bytes.
        unsafe { core::ptr::copy_nonoverlapping(p.as_ptr().add(i % 256), (addr + i) as *mut u8, n) };
        i += n;
    }
}

/// Checks that bytes `[from, to)` of the block at `addr` hold the pattern
/// of `tag` (`None`: zero).
fn expect(addr: usize, from: usize, to: usize, tag: Option<u8>, what: &str) {
    if from >= to {
        return;
    }
    // SAFETY: `[addr + from, addr + to)` is inside a live block of ours
    // (caller), initialised by our writes or the allocator's zeroing.
    let s = unsafe { core::slice::from_raw_parts((addr + from) as *const u8, to - from) };
    let p = tag.map_or([0; 256], pattern);
    let mut i = from;
    for chunk in s.chunks(256) {
        // The chunks start at multiples of 256 only when `from` does: compare
        // against the pattern rotated by `from`.
        let ok = if from.is_multiple_of(256) {
            chunk == &p[..chunk.len()]
        } else {
            chunk.iter().enumerate().all(|(j, &b)| b == p[(i + j) % 256])
        };
        if !ok {
            let j = chunk.iter().enumerate().position(|(j, &b)| b != p[(i + j) % 256]).unwrap();
            panic!(
                "{what}: block {addr:#x} byte {} is {:#04x}, expected {:#04x} (checked [{from}, {to}))",
                i + j,
                chunk[j],
                p[(i + j) % 256]
            );
        }
        i += chunk.len();
    }
}

/// Where an operation goes: the root (`&Kmem`, no group entered), the
/// child's `CgroupAllocator` (its `GlobalAlloc` calls enter the child), or
/// `&Kmem` inside the child's `enter()` guard.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Via {
    Root,
    ChildAllocator,
    ChildEntered,
}

/// What the programs did, summed over a test's programs.
#[derive(Default, Debug)]
struct Counts {
    allocs: usize,
    alloc_failures_root: usize,
    alloc_failures_child: usize,
    resizes: usize,
    resize_failures_root: usize,
    resize_failures_child: usize,
    in_place: usize,
    moved: usize,
    align_changes: usize,
    to_zero: usize,
    from_zero: usize,
}

/// The shadow model of one program's live blocks.
struct Model {
    blocks: Vec<Block>,
    /// Start to end of every live block's usable extent.
    extents: BTreeMap<usize, usize>,
    /// Zero-size blocks (dangling pointers) and their alignment.
    zsts: Vec<(usize, usize)>,
    /// The memory handed to the source, if it is fixed.
    bounds: Option<(usize, usize)>,
}

impl Model {
    /// Checks a block the allocator just handed out (or resized) and adds
    /// it: aligned, inside the memory, overlapping no live block.
    fn insert(&mut self, b: Block, what: &str) {
        assert!(b.usable >= b.req, "{what}: usable {} below the request {}", b.usable, b.req);
        assert!(b.addr.is_multiple_of(b.align), "{what}: {:#x} not aligned to {}", b.addr, b.align);
        let end = b.addr + b.usable;
        if let Some((lo, hi)) = self.bounds {
            assert!(
                b.addr >= lo && end <= hi,
                "{what}: [{:#x}, {end:#x}) outside the region [{lo:#x}, {hi:#x})",
                b.addr
            );
        }
        if let Some((&s, &e)) = self.extents.range(..end).next_back() {
            assert!(e <= b.addr, "{what}: [{:#x}, {end:#x}) overlaps live [{s:#x}, {e:#x})", b.addr);
        }
        self.extents.insert(b.addr, end);
        self.blocks.push(b);
    }

    /// Takes block `i` out of the model (checking its contents).
    fn remove(&mut self, i: usize, what: &str) -> Block {
        let b = self.blocks.swap_remove(i);
        expect(b.addr, 0, b.usable, Some(b.tag), what);
        assert_eq!(self.extents.remove(&b.addr), Some(b.addr + b.usable));
        b
    }

    /// The cheap check after every step: each live block's first and last
    /// byte (every byte every 256 steps: [`Model::full_check`]).
    fn sweep(&self) {
        for b in &self.blocks {
            expect(b.addr, 0, 1, Some(b.tag), "sweep");
            expect(b.addr, b.usable - 1, b.usable, Some(b.tag), "sweep");
        }
    }

    /// Every byte of every live block, and no two extents overlapping.
    fn full_check(&self) {
        for b in &self.blocks {
            expect(b.addr, 0, b.usable, Some(b.tag), "full check");
        }
        let mut last = 0;
        for (&s, &e) in &self.extents {
            assert!(s >= last, "extents overlap at {s:#x}");
            last = e;
        }
        assert_eq!(self.extents.len(), self.blocks.len());
    }
}

/// A size in `1..=70_000`, mostly small.
fn random_size(rng: &mut Rng) -> usize {
    match rng.below(100) {
        0..=59 => 1 + rng.below(256) as usize,
        60..=79 => 1 + rng.below(4096) as usize,
        80..=91 => 1 + rng.below(32_768) as usize,
        _ => 1 + rng.below(70_000) as usize,
    }
}

/// A power of two in `1..=8192`, mostly small.
fn random_align(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0..=5 => 1 << rng.below(4),
        6..=8 => 1 << rng.below(11),
        _ => 1 << rng.below(14),
    }
}

/// A layout size that fits `b` for the `Allocator` methods: anything
/// between the request and the usable length.
fn fitting_size(rng: &mut Rng, b: &Block) -> usize {
    match rng.below(3) {
        0 => b.req,
        1 => b.usable,
        _ => b.req + rng.below((b.usable - b.req + 1) as u64) as usize,
    }
}

/// Runs `f` with the `Allocator` for `via` (entering the child for
/// `ChildEntered`).
fn with_allocator<S: PageSource, T>(
    k: &'static Kmem<S>,
    child: &Cgroup<'static, Kmem<S>>,
    via: Via,
    f: impl FnOnce(&dyn Allocator) -> T,
) -> T {
    match via {
        Via::Root => f(&k),
        Via::ChildAllocator => f(&child.allocator()),
        Via::ChildEntered => {
            let _g = child.enter();
            f(&k)
        }
    }
}

/// Runs `f` in the group of `via` (entering the child for either child
/// way), for the `GlobalAlloc` calls.
fn in_group<S: PageSource, T>(child: &Cgroup<'static, Kmem<S>>, via: Via, f: impl FnOnce() -> T) -> T {
    if via == Via::Root {
        f()
    } else {
        let _g = child.enter();
        f()
    }
}

/// One random program of `steps` steps on `k`, whose source holds
/// `bounds` if it is a `Region`; the child's limit is `max` bytes.
fn program<S: PageSource>(
    k: &'static Kmem<S>,
    bounds: Option<(usize, usize)>,
    seed: u64,
    steps: u32,
    max: usize,
    c: &mut Counts,
) {
    let mut rng = Rng(seed);
    let baseline = k.source().stats().pages_in_use;
    let child = k.root().create_child(&format!("resize-{seed:x}")).unwrap();
    child.set_max(max).unwrap();
    let mut m = Model { blocks: Vec::new(), extents: BTreeMap::new(), zsts: Vec::new(), bounds };
    let mut next_tag = 1u8;
    let mut tag = || {
        next_tag = next_tag.wrapping_add(1).max(1);
        next_tag
    };
    // Phases of 400 steps: filling (allocations and grows ahead) and
    // draining (frees and shrinks ahead), so that the memory runs out and
    // comes back.
    for step in 0..steps {
        let filling = (step / 400) % 2 == 0;
        let via = match rng.below(3) {
            0 => Via::Root,
            1 => Via::ChildAllocator,
            _ => Via::ChildEntered,
        };
        let op = rng.below(100);
        let (alloc_w, free_w) = if filling { (40, 52) } else { (20, 55) };
        if op < alloc_w {
            // Allocate, through GlobalAlloc or Allocator (zeroed or not).
            let (size, align) = (random_size(&mut rng), random_align(&mut rng));
            let layout = Layout::from_size_align(size, align).unwrap();
            let kind = rng.below(3);
            let got = match kind {
                0 => in_group(&child, via, || {
                    // SAFETY: a non-zero size.
                    let p = unsafe { k.alloc(layout) };
                    NonNull::new(p).map(|p| (p.as_ptr().addr(), size))
                }),
                _ => with_allocator(k, &child, via, |a| {
                    let r = if kind == 1 { a.allocate(layout) } else { a.allocate_zeroed(layout) };
                    r.ok().map(|p| (p.cast::<u8>().as_ptr().addr(), p.len()))
                }),
            };
            c.allocs += 1;
            match got {
                Some((addr, usable)) => {
                    if kind == 2 {
                        expect(addr, 0, usable, None, "allocate_zeroed");
                    }
                    let b = Block { addr, req: size, usable, align, tag: tag() };
                    m.insert(b, "allocate");
                    fill(addr, 0, usable, b.tag);
                }
                None if via == Via::Root => c.alloc_failures_root += 1,
                None => c.alloc_failures_child += 1,
            }
        } else if op < free_w {
            // Free, through any handle: frees find the owner themselves.
            if m.blocks.is_empty() {
                continue;
            }
            let i = rng.below(m.blocks.len() as u64) as usize;
            let b = m.remove(i, "before free");
            match rng.below(3) {
                0 => {
                    let layout = Layout::from_size_align(b.req, b.align).unwrap();
                    // SAFETY: a live block, freed once with its layout.
                    unsafe { k.dealloc(b.addr as *mut u8, layout) };
                }
                _ => {
                    let layout = Layout::from_size_align(fitting_size(&mut rng, &b), b.align).unwrap();
                    with_allocator(k, &child, via, |a| {
                        // SAFETY: a live block, freed once with a layout that fits it.
                        unsafe { a.deallocate(NonNull::new(b.addr as *mut u8).unwrap(), layout) }
                    });
                }
            }
        } else if op < 60 {
            // GlobalAlloc::realloc to a random size (or near the old one).
            if m.blocks.is_empty() {
                continue;
            }
            let i = rng.below(m.blocks.len() as u64) as usize;
            let b = m.blocks[i];
            let new_size = match rng.below(3) {
                0 => random_size(&mut rng),
                1 => (b.req + rng.below(64) as usize).saturating_sub(32).max(1),
                _ => (b.req + rng.below(b.req as u64 + 1) as usize).clamp(1, 70_000.max(b.req)),
            };
            let layout = Layout::from_size_align(b.req, b.align).unwrap();
            // SAFETY: a live block with the layout it was asked for, and a
            // non-zero size that rounds to a valid layout.
            let q = in_group(&child, via, || unsafe { k.realloc(b.addr as *mut u8, layout, new_size) });
            c.resizes += 1;
            let nb = Block { addr: q.addr(), req: new_size, usable: new_size, align: b.align, tag: b.tag };
            resized(&mut m, c, i, b, b.req, NonNull::new(q).map(|_| nb), false, via, "realloc");
        } else if op < 90 {
            // Allocator::grow, grow_zeroed or shrink, maybe realigned.
            if m.blocks.is_empty() {
                continue;
            }
            let i = rng.below(m.blocks.len() as u64) as usize;
            let b = m.blocks[i];
            let old_size = fitting_size(&mut rng, &b);
            let new_align = if rng.below(3) == 0 { random_align(&mut rng) } else { b.align };
            let kind = rng.below(3);
            let new_size = if kind < 2 {
                match rng.below(3) {
                    0 => old_size + rng.below(16) as usize,
                    1 => old_size.max(random_size(&mut rng)),
                    // Doubling at most, and not past 140,000 bytes.
                    _ => (old_size + rng.below(old_size as u64 + 1) as usize).min(old_size.max(140_000)),
                }
            } else {
                match rng.below(8) {
                    0 => 0,
                    1..=3 => old_size - rng.below(old_size.min(16) as u64 + 1) as usize,
                    _ => rng.below(old_size as u64 + 1) as usize,
                }
            };
            let old = Layout::from_size_align(old_size, b.align).unwrap();
            let new = Layout::from_size_align(new_size, new_align).unwrap();
            let p = NonNull::new(b.addr as *mut u8).unwrap();
            let r = with_allocator(k, &child, via, |a| {
                // SAFETY: a live block, with a layout that fits it; the new
                // size is at least (grow) or at most (shrink) the old one.
                unsafe {
                    match kind {
                        0 => a.grow(p, old, new),
                        1 => a.grow_zeroed(p, old, new),
                        _ => a.shrink(p, old, new),
                    }
                }
            });
            c.resizes += 1;
            if new_align != b.align {
                c.align_changes += 1;
            }
            let what = ["grow", "grow_zeroed", "shrink"][kind as usize];
            let nb = r.ok().map(|q| Block {
                addr: q.cast::<u8>().as_ptr().addr(),
                req: new_size,
                usable: q.len(),
                align: new_align,
                tag: b.tag,
            });
            resized(&mut m, c, i, b, old_size, nb, kind == 1, via, what);
        } else if op < 96 {
            // Zero-size blocks: allocate one, grow one, free one.
            match rng.below(3) {
                0 => {
                    let align = random_align(&mut rng);
                    let layout = Layout::from_size_align(0, align).unwrap();
                    let p = with_allocator(k, &child, via, |a| a.allocate(layout)).unwrap();
                    assert_eq!(p.len(), 0);
                    let addr = p.cast::<u8>().as_ptr().addr();
                    assert!(addr.is_multiple_of(align), "zero-size block {addr:#x} not aligned to {align}");
                    m.zsts.push((addr, align));
                }
                1 if !m.zsts.is_empty() => {
                    let j = rng.below(m.zsts.len() as u64) as usize;
                    let (addr, align) = m.zsts[j];
                    let new_align = if rng.below(2) == 0 { random_align(&mut rng) } else { align };
                    let new = Layout::from_size_align(random_size(&mut rng), new_align).unwrap();
                    let zeroed = rng.below(2) == 0;
                    let r = with_allocator(k, &child, via, |a| {
                        let p = NonNull::new(addr as *mut u8).unwrap();
                        let old = Layout::from_size_align(0, align).unwrap();
                        // SAFETY: a zero-size block of this handle's `Kmem`,
                        // grown to a larger size.
                        unsafe { if zeroed { a.grow_zeroed(p, old, new) } else { a.grow(p, old, new) } }
                    });
                    c.resizes += 1;
                    match r {
                        Ok(q) => {
                            m.zsts.swap_remove(j);
                            c.from_zero += 1;
                            let b = Block {
                                addr: q.cast::<u8>().as_ptr().addr(),
                                req: new.size(),
                                usable: q.len(),
                                align: new_align,
                                tag: tag(),
                            };
                            m.insert(b, "grow from zero size");
                            if zeroed {
                                expect(b.addr, 0, b.usable, None, "grow_zeroed from zero size");
                            }
                            fill(b.addr, 0, b.usable, b.tag);
                        }
                        Err(_) if via == Via::Root => c.resize_failures_root += 1,
                        Err(_) => c.resize_failures_child += 1,
                    }
                }
                2 if !m.zsts.is_empty() => {
                    let (addr, align) = m.zsts.swap_remove(rng.below(m.zsts.len() as u64) as usize);
                    with_allocator(k, &child, via, |a| {
                        // SAFETY: a zero-size block: nothing to free.
                        unsafe {
                            a.deallocate(
                                NonNull::new(addr as *mut u8).unwrap(),
                                Layout::from_size_align(0, align).unwrap(),
                            )
                        }
                    });
                }
                _ => {}
            }
        } else {
            m.full_check();
        }
        m.sweep();
        assert!(child.usage() <= max, "seed {seed:#x} step {step}: child usage {} over its max {max}", child.usage());
        if step % 256 == 255 {
            m.full_check();
        }
    }
    m.full_check();
    // Free everything, in a random order, through random handles.
    while !m.blocks.is_empty() {
        let i = rng.below(m.blocks.len() as u64) as usize;
        let b = m.remove(i, "final free");
        let layout = Layout::from_size_align(fitting_size(&mut rng, &b), b.align).unwrap();
        if rng.below(2) == 0 {
            // SAFETY: a live block, freed once with a layout that fits it.
            unsafe { (&k).deallocate(NonNull::new(b.addr as *mut u8).unwrap(), layout) };
        } else {
            // SAFETY: as above.
            unsafe { child.allocator().deallocate(NonNull::new(b.addr as *mut u8).unwrap(), layout) };
        }
    }
    for (addr, align) in m.zsts.drain(..) {
        // SAFETY: a zero-size block: nothing to free.
        unsafe { (&k).deallocate(NonNull::new(addr as *mut u8).unwrap(), Layout::from_size_align(0, align).unwrap()) };
    }
    if let Err(st) = child.check_empty() {
        panic!("seed {seed:#x}: the child is not empty after every block was freed:\n{st}");
    }
    assert_eq!(child.usage(), 0, "seed {seed:#x}: the child's usage");
    if let Err(st) = k.root().check_empty() {
        panic!("seed {seed:#x}: the root is not empty after every block was freed:\n{st}");
    }
    child.remove().unwrap();
    drop(child);
    k.shrink();
    assert_eq!(k.source().stats().pages_in_use, baseline, "seed {seed:#x}: pages in use after shrink");
    assert_eq!(k.stats().large_objects, 0, "seed {seed:#x}: large objects left");
}

/// Checks the outcome of resizing block `i` (`b`, resized with the layout
/// size `old_size`): on failure it is intact and still live; on success
/// the new block `nb` keeps the first `min(old_size, new)` bytes (the rest
/// zero for `grow_zeroed`) and replaces it in the model, its new bytes
/// filled. A shrink to zero size leaves a zero-size block.
#[allow(clippy::too_many_arguments)]
fn resized(
    m: &mut Model,
    c: &mut Counts,
    i: usize,
    b: Block,
    old_size: usize,
    nb: Option<Block>,
    zeroed: bool,
    via: Via,
    what: &str,
) {
    let Some(nb) = nb else {
        // Failed: the old block is untouched and still ours.
        expect(b.addr, 0, b.usable, Some(b.tag), &format!("{what} failed"));
        assert!(m.extents.get(&b.addr) == Some(&(b.addr + b.usable)));
        match via {
            Via::Root => c.resize_failures_root += 1,
            _ => c.resize_failures_child += 1,
        }
        return;
    };
    m.blocks.swap_remove(i);
    assert_eq!(m.extents.remove(&b.addr), Some(b.addr + b.usable));
    if nb.req == 0 {
        // Shrunk to nothing: a dangling pointer, the block freed.
        c.to_zero += 1;
        assert_eq!(nb.usable, 0, "{what} to zero size");
        assert!(nb.addr.is_multiple_of(nb.align), "{what}: zero-size {:#x} not aligned to {}", nb.addr, nb.align);
        m.zsts.push((nb.addr, nb.align));
        return;
    }
    if nb.addr == b.addr {
        c.in_place += 1;
    } else {
        c.moved += 1;
        let end = nb.addr + nb.usable;
        assert!(end <= b.addr || b.addr + b.usable <= nb.addr, "{what}: moved block overlaps its old self");
    }
    let keep = old_size.min(nb.req);
    expect(nb.addr, 0, keep, Some(b.tag), what);
    if zeroed {
        expect(nb.addr, old_size, nb.usable, None, what);
    }
    m.insert(nb, what);
    fill(nb.addr, keep, nb.usable, nb.tag);
}

/// A program of `steps` steps for each seed, one after the other on one
/// `Kmem` over a 3 MiB `Region` (each with a new child, limited to
/// 384 KiB); asserts that the region ran out and the limit held.
fn region_programs(seeds: std::ops::Range<u64>, steps: u32) {
    let mut c = Counts::default();
    let (k, bounds) = region_kmem(3 << 20);
    for seed in seeds {
        program(k, Some(bounds), seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1, steps, 384 << 10, &mut c);
    }
    assert!(c.alloc_failures_root > 0, "the region never ran out: {c:?}");
    assert!(c.alloc_failures_child > 0 && c.resize_failures_child > 0, "the child's limit never held: {c:?}");
    assert!(c.in_place > 0 && c.moved > 0 && c.align_changes > 0 && c.to_zero > 0 && c.from_zero > 0, "{c:?}");
}

#[test]
fn region_resize_programs_a() {
    region_programs(1..17, 4000);
}

#[test]
fn region_resize_programs_b() {
    region_programs(17..33, 4000);
}

#[test]
fn os_pages_resize_programs() {
    let mut c = Counts::default();
    let k: &'static Kmem<OsPages> = Box::leak(Box::new(Kmem::new(OsPages::new())));
    for seed in 100..108u64 {
        program(k, None, seed.wrapping_mul(0x1234_5678_9ABC_DEF1) | 1, 3000, 512 << 10, &mut c);
    }
    assert!(c.alloc_failures_child > 0 && c.resize_failures_child > 0, "the child's limit never held: {c:?}");
    assert!(c.in_place > 0 && c.moved > 0 && c.align_changes > 0, "{c:?}");
}
