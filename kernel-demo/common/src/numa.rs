//! Two NUMA nodes, shared by the demo kernels (`kernel-demo`,
//! `kernel-demo/aarch64`), which give it their global heap and their
//! two-node heap (`KMEM_NUMA`) through [`Arch`].
//!
//! With `numa` on its command line, a kernel learns its nodes from the
//! firmware (x86_64: the ACPI SRAT; aarch64: the device tree's
//! `numa-node-id` properties), hands each node's RAM to `KMEM_NUMA` as that
//! node's regions ([`give`]), tells it the CPU → node map
//! ([`set_cpu_node`], read back by [`NumaCpu`]'s `node_of`), and runs
//! [`cpu_part`] on every CPU at once:
//!
//! 1. every CPU allocates [`OBJECTS`] 64-byte objects inside the group
//!    `numa`, and each must lie in its node's memory (by address range);
//!    the boot CPU then checks the group's per-node usage
//!    (`GroupStat::nodes`) against the objects each node holds and the
//!    pages each node's regions handed out;
//! 2. every CPU frees the objects of a CPU on the other node (remote
//!    frees), then allocates as many again: each must still be local, so
//!    none of the remote objects went into the freeing CPU's magazines;
//!    they went back to their own node;
//! 3. every CPU frees its local objects; after a shrink the group's usage
//!    is zero on every node and each node's regions are back to their free
//!    page count from before the test;
//!
//! then prints one line per node: `node N: pages P, local allocations L,
//! remote frees R` (P: the group's pages on the node after step 1).
//!
//! `KMEM_NUMA` is a heap of its own, beside the global one, whose
//! `kmemcg::Cpu` ([`NumaCpu`]) answers `node_of`/`nodes` from the map: the global
//! heap keeps its one-node platform, so the other boots and their
//! instruction counts do not change. With `numa icount`, [`measure`] counts
//! guest instructions per local allocation, local free and remote free
//! instead (see `scripts/kernel-icount.sh`, `BENCHMARKS.md`).

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use kmemcg::{Cgroup, PAGE_SIZE, PageSource};

use crate::arch::{Arch, NumaHeap};
use crate::kprintln;
pub use crate::node_map::{MAX_CPUS, NODES, NumaCpu, cpu_node, nodes, set_cpu_node};
use crate::publish::Published;

/// Memory spans (a node's ranges after the kernel and boot data are cut
/// out) the address → node check keeps.
const MAX_SPANS: usize = 16;
/// Objects each CPU allocates in each step.
pub const OBJECTS: usize = 1024;
/// Their size.
const SIZE: usize = 64;
/// Operations in the shorter measured run of [`measure`] (the longer one
/// has twice as many).
const OPS: usize = 20_000;

type Test = Result<(), &'static str>;

fn check(ok: bool, what: &'static str) -> Test {
    if ok { Ok(()) } else { Err(what) }
}

/// Node `i` of each span: `[start, end)`.
static SPAN_START: [AtomicU64; MAX_SPANS] = [const { AtomicU64::new(0) }; MAX_SPANS];
static SPAN_END: [AtomicU64; MAX_SPANS] = [const { AtomicU64::new(0) }; MAX_SPANS];
static SPAN_NODE: [AtomicUsize; MAX_SPANS] = [const { AtomicUsize::new(0) }; MAX_SPANS];
/// Spans published (`Release` after writing one).
static SPANS: AtomicUsize = AtomicUsize::new(0);

/// Hands `[start, end)` (page aligned) to `KMEM_NUMA` as memory of `node`
/// and records it for the address checks.
///
/// # Safety
///
/// The range must be RAM, mapped, used by nothing else, for the rest of
/// the program.
pub unsafe fn give<A: Arch>(start: u64, end: u64, node: usize) -> Test {
    let n = SPANS.load(Ordering::Relaxed);
    check(n < MAX_SPANS && node < NODES, "too many NUMA memory spans, or a node out of range")?;
    // SAFETY: forwarded from the caller.
    unsafe { A::numa_heap().source().add_raw(start as *mut u8, (end - start) as usize, node) }
        .map_err(|_| "kmemcg refused a node's memory range")?;
    SPAN_START[n].store(start, Ordering::Relaxed);
    SPAN_END[n].store(end, Ordering::Relaxed);
    SPAN_NODE[n].store(node, Ordering::Relaxed);
    SPANS.store(n + 1, Ordering::Release);
    kprintln!(A; "numa: node {node}: {start:#x}..{end:#x} ({} KiB) -> kmemcg", (end - start) >> 10);
    Ok(())
}

/// The node whose memory holds `addr`.
fn node_of_addr(addr: usize) -> Option<usize> {
    let a = addr as u64;
    (0..SPANS.load(Ordering::Acquire))
        .find(|&i| SPAN_START[i].load(Ordering::Relaxed) <= a && a < SPAN_END[i].load(Ordering::Relaxed))
        .map(|i| SPAN_NODE[i].load(Ordering::Relaxed))
}

/// A barrier that spins (the NUMA boots run no timer to wake a sleeper).
struct Barrier {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl Barrier {
    fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.store(generation + 1, Ordering::Release);
            return;
        }
        while self.generation.load(Ordering::Acquire) == generation {
            core::hint::spin_loop();
        }
    }
}

/// What every CPU of the test shares (leaked by the boot CPU), for the
/// kernel whose `kmemcg::Cpu` is `C`.
struct Shared<C: kmemcg::Cpu> {
    /// CPUs taking part.
    n: usize,
    barrier: Barrier,
    /// The test's group (none when the boot measures: an allocator with a
    /// group besides the root takes a longer path on every refill, which
    /// would make the comparison with the global heap unfair).
    group: Option<Cgroup<'static, NumaHeap<C>>>,
    /// `partner[i]`: the CPU on the other node whose objects CPU `i` frees.
    partner: [usize; MAX_CPUS],
    /// `objects[i * OBJECTS..][..OBJECTS]`: CPU `i`'s objects of the
    /// current step.
    objects: Vec<AtomicUsize>,
    /// Allocations that came from the allocating CPU's node, per node.
    local: [AtomicUsize; NODES],
    /// Frees on a node's CPUs of the other node's objects, per node.
    remote: [AtomicUsize; NODES],
    /// The first failure.
    failure: AtomicPtr<&'static str>,
    /// For [`measure`]: set by the node-1 CPU once `remote_objects` holds
    /// its objects.
    ready: AtomicBool,
    remote_objects: Vec<AtomicUsize>,
}

/// The `Shared<A::Cpu>` [`start`] published.
static SHARED: Published = Published::new();

impl<C: kmemcg::Cpu> Shared<C> {
    fn fail(&self, e: &'static str) {
        // A leaked copy, so the pointer outlives this call.
        let p = Box::into_raw(Box::new(e));
        if self.failure.compare_exchange(core::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // SAFETY: `p` came from `Box::into_raw` above and was not published.
            drop(unsafe { Box::from_raw(p) });
        }
    }

    fn failure(&self) -> Option<&'static str> {
        let p = self.failure.load(Ordering::Acquire);
        // SAFETY: a leaked box from `fail`, never freed once published.
        (!p.is_null()).then(|| unsafe { *p })
    }
}

/// The objects' layout: [`SIZE`] bytes, 8-byte aligned.
fn layout() -> Layout {
    Layout::new::<[u64; SIZE / 8]>()
}

/// Sets up the test on `ncpus` CPUs (or the measurement, if `measuring`)
/// and returns once other CPUs may call [`cpu_part`] (or [`remote_part`])
/// (boot CPU, after [`give`] and [`set_cpu_node`]).
pub fn start<A: Arch>(ncpus: usize, measuring: bool) -> Test {
    check(SPANS.load(Ordering::Relaxed) > 0, "no memory given to the NUMA heap")?;
    check((1..=MAX_CPUS).contains(&ncpus), "CPU count out of range")?;
    crate::node_map::set_nodes_in_use();
    let node_cpus = |n: usize| (0..ncpus).filter(move |&c| cpu_node(c) == n);
    check(node_cpus(0).count() == node_cpus(1).count(), "the nodes do not have as many CPUs each")?;
    let mut partner = [0; MAX_CPUS];
    for n in 0..NODES {
        for (mine, theirs) in node_cpus(n).zip(node_cpus(1 - n)) {
            partner[mine] = theirs;
        }
    }
    for (c, p) in partner[..ncpus].iter().enumerate() {
        kprintln!(A; "numa: cpu {c} on node {}, frees the objects of cpu {p}", cpu_node(c));
    }
    let group = if measuring {
        None
    } else {
        Some(A::numa_heap().root().create_child("numa").map_err(|_| "create_child(numa)")?)
    };
    let remote_objects = if measuring { 3 * OPS } else { 0 };
    SHARED.publish(Shared::<A::Cpu> {
        n: ncpus,
        barrier: Barrier { n: ncpus, arrived: AtomicUsize::new(0), generation: AtomicUsize::new(0) },
        group,
        partner,
        objects: (0..MAX_CPUS * OBJECTS).map(|_| AtomicUsize::new(0)).collect(),
        local: [const { AtomicUsize::new(0) }; NODES],
        remote: [const { AtomicUsize::new(0) }; NODES],
        failure: AtomicPtr::new(core::ptr::null_mut()),
        ready: AtomicBool::new(false),
        remote_objects: (0..remote_objects).map(|_| AtomicUsize::new(0)).collect(),
    });
    Ok(())
}

/// The shared state, once the boot CPU published it.
fn shared<A: Arch>() -> &'static Shared<A::Cpu> {
    SHARED.wait()
}

/// Allocates CPU `me`'s objects into `objects[slot]`; each must be on `node`.
fn alloc_local<A: Arch>(sh: &Shared<A::Cpu>, me: usize, slot: usize) -> Test {
    let node = cpu_node(me);
    for o in &sh.objects[slot * OBJECTS..][..OBJECTS] {
        // SAFETY: a valid layout of non-zero size.
        let p = unsafe { A::numa_heap().alloc(layout()) };
        check(!p.is_null(), "a NUMA allocation failed")?;
        o.store(p as usize, Ordering::Relaxed);
        check(node_of_addr(p as usize) == Some(node), "an object allocated on a CPU is not in its node's memory")?;
        sh.local[node].fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Frees `objects[slot]` on CPU `me`, counting the remote ones.
fn free_all<A: Arch>(sh: &Shared<A::Cpu>, me: usize, slot: usize, expect_remote: bool) -> Test {
    let node = cpu_node(me);
    for o in &sh.objects[slot * OBJECTS..][..OBJECTS] {
        let p = o.swap(0, Ordering::Relaxed);
        let home = node_of_addr(p).ok_or("an object outside every node")?;
        check((home != node) == expect_remote, "an object is not on the node the test expects")?;
        if home != node {
            sh.remote[node].fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: a live object of `KMEM_NUMA` with this layout, freed once
        // (swapped out of its cell).
        unsafe { A::numa_heap().dealloc(p as *mut u8, layout()) };
    }
    Ok(())
}

/// Pages each node's regions have free.
fn free_pages<A: Arch>() -> [usize; NODES] {
    core::array::from_fn(|n| A::numa_heap().source().free_pages_on(n))
}

/// CPU `me`'s part of the test, on every CPU at once (the boot CPU is
/// index 0 and checks between the steps). Returns the first failure of
/// any CPU (on the boot CPU; the others return `Ok`).
pub fn cpu_part<A: Arch>(me: usize) -> Test {
    let sh = shared::<A>();
    let group = sh.group.as_ref().ok_or("the NUMA test runs in a measuring boot")?;
    let step = |r: Test| {
        if let Err(e) = r {
            sh.fail(e);
        }
    };
    let baseline = if me == 0 {
        // One object in the group first, so the group's kmalloc-64 child
        // cache (allocator metadata, on this CPU's node) exists before the
        // free page counts are taken.
        let _in = group.enter();
        // SAFETY: a valid layout of non-zero size.
        let p = unsafe { A::numa_heap().alloc(layout()) };
        if !p.is_null() {
            // SAFETY: just allocated with this layout, freed once.
            unsafe { A::numa_heap().dealloc(p, layout()) };
        }
        A::numa_heap().shrink();
        free_pages::<A>()
    } else {
        [0; NODES]
    };
    let mut peak = [0; NODES];
    sh.barrier.wait();
    // 1. Local allocations, charged to the group.
    {
        let _in = group.enter();
        step(alloc_local::<A>(sh, me, me));
    }
    sh.barrier.wait();
    if me == 0 {
        let r = check_usage::<A>(sh, group, baseline);
        peak = r.unwrap_or_default();
        step(r.map(drop));
    }
    sh.barrier.wait();
    // 2. Remote frees, then local allocations again.
    {
        let _in = group.enter();
        let partner = sh.partner[me];
        step(free_all::<A>(sh, me, partner, true));
        sh.barrier.wait(); // every partner's objects are free before reuse
        step(alloc_local::<A>(sh, me, me));
    }
    sh.barrier.wait();
    // 3. Local frees.
    step(free_all::<A>(sh, me, me, false));
    sh.barrier.wait();
    if me != 0 {
        return Ok(());
    }
    if let Some(e) = sh.failure() {
        return Err(e);
    }
    check_end::<A>(group, baseline)?;
    for (n, pages) in peak.iter().enumerate() {
        kprintln!(A;
            "node {n}: pages {pages}, local allocations {}, remote frees {}",
            sh.local[n].load(Ordering::Relaxed),
            sh.remote[n].load(Ordering::Relaxed)
        );
    }
    let cpus_per_node = sh.n / NODES;
    for n in 0..NODES {
        check(
            sh.local[n].load(Ordering::Relaxed) == 2 * OBJECTS * cpus_per_node
                && sh.remote[n].load(Ordering::Relaxed) == OBJECTS * cpus_per_node,
            "a node's allocation or remote free count is off",
        )?;
    }
    Ok(())
}

/// After step 1: the group's usage on each node covers the objects its
/// CPUs hold, is no more than the pages that node's regions handed out,
/// and the nodes add up to the usage less the stocks. Returns the group's
/// pages on each node.
fn check_usage<A: Arch>(
    sh: &Shared<A::Cpu>,
    group: &Cgroup<'static, NumaHeap<A::Cpu>>,
    baseline: [usize; NODES],
) -> Result<[usize; NODES], &'static str> {
    let st = group.stat();
    let now = free_pages::<A>();
    let per_node = OBJECTS * SIZE * (sh.n / NODES);
    for n in 0..NODES {
        let taken = baseline[n].saturating_sub(now[n]);
        kprintln!(A;
            "numa: after the local allocations: group usage on node {n} {} KiB, node {n} handed out {taken} pages",
            st.nodes[n] >> 10
        );
        check(st.nodes[n] >= per_node, "the group's usage on a node is less than the objects it holds there")?;
        check(st.nodes[n] <= taken * PAGE_SIZE, "the group's usage on a node exceeds the pages the node handed out")?;
    }
    check(st.nodes[NODES..].iter().all(|&b| b == 0), "usage on a node that does not exist")?;
    check(st.nodes.iter().sum::<usize>() + st.stocked == st.usage, "the nodes do not add up to the group's usage")?;
    Ok(core::array::from_fn(|n| st.nodes[n] / PAGE_SIZE))
}

/// After step 3 and a shrink: no usage left on any node, and every page
/// back on its own node.
fn check_end<A: Arch>(group: &Cgroup<'static, NumaHeap<A::Cpu>>, baseline: [usize; NODES]) -> Test {
    A::numa_heap().shrink();
    let st = group.stat();
    let now = free_pages::<A>();
    kprintln!(A;
        "numa: after the frees and a shrink: group usage {} B ({:?} per node); free pages per node {:?}, {:?} before",
        st.usage,
        &st.nodes[..NODES],
        now,
        baseline
    );
    check(st.nodes.iter().all(|&b| b == 0), "the group still has usage on a node")?;
    check(now == baseline, "a node's free pages did not come back")
}

/// The node-1 CPU's part of [`measure`]: allocates the objects the boot
/// CPU will free remotely, then returns (the caller parks the CPU).
pub fn remote_part<A: Arch>(me: usize) {
    let sh = shared::<A>();
    if cpu_node(me) == 1 && sh.partner[0] == me {
        for o in &sh.remote_objects {
            // SAFETY: a valid layout of non-zero size.
            let p = unsafe { A::numa_heap().alloc(layout()) };
            if p.is_null() || node_of_addr(p as usize) != Some(1) {
                sh.fail("a node-1 allocation failed or is not on node 1");
            }
            o.store(p as usize, Ordering::Relaxed);
        }
        sh.ready.store(true, Ordering::Release);
    }
}

/// Guest instructions per operation, `(ticks(2n) - ticks(n)) / n`.
fn per_op(one: u64, two: u64, ticks_per_insn: f64) -> f64 {
    two.saturating_sub(one) as f64 / ticks_per_insn / OPS as f64
}

/// Ticks for allocating `cells.len()` objects from `heap` into `cells`.
fn time_allocs<H: GlobalAlloc>(heap: &H, cells: &[AtomicUsize], ticks: fn() -> u64) -> Result<u64, &'static str> {
    let t0 = ticks();
    for c in cells {
        // SAFETY: a valid layout of non-zero size.
        let p = unsafe { heap.alloc(layout()) };
        if p.is_null() {
            return Err("an allocation failed while measuring");
        }
        c.store(p as usize, Ordering::Relaxed);
    }
    Ok(ticks() - t0)
}

/// Ticks for freeing the objects of `heap` in `cells`.
///
/// # Safety
///
/// `cells` hold live objects of `heap` with the test's layout, not freed
/// elsewhere.
unsafe fn time_frees<H: GlobalAlloc>(heap: &H, cells: &[AtomicUsize], ticks: fn() -> u64) -> u64 {
    let t0 = ticks();
    for c in cells {
        // SAFETY: forwarded from the caller.
        unsafe { heap.dealloc(c.load(Ordering::Relaxed) as *mut u8, layout()) };
    }
    ticks() - t0
}

/// Instructions per allocation and per free of `heap` on this CPU (the
/// objects local).
fn local_costs<H: GlobalAlloc>(
    heap: &H,
    cells: &[AtomicUsize],
    ticks: fn() -> u64,
    tpi: f64,
) -> Result<(f64, f64), &'static str> {
    let (one, two) = (&cells[..OPS], &cells[..2 * OPS]);
    time_allocs(heap, one, ticks)?;
    // SAFETY: just allocated from `heap`.
    unsafe { time_frees(heap, one, ticks) };
    let a1 = time_allocs(heap, one, ticks)?;
    // SAFETY: as above.
    let f1 = unsafe { time_frees(heap, one, ticks) };
    let a2 = time_allocs(heap, two, ticks)?;
    // SAFETY: as above.
    let f2 = unsafe { time_frees(heap, two, ticks) };
    Ok((per_op(a1, a2, tpi), per_op(f1, f2, tpi)))
}

/// Instructions per alloc+free pair of `heap` on this CPU, the objects
/// local and the magazines loaded (the kernels' `icount` loop).
fn pair_cost<H: GlobalAlloc>(heap: &H, ticks: fn() -> u64, tpi: f64) -> Result<f64, &'static str> {
    let run = |n: usize| {
        let t0 = ticks();
        for _ in 0..n {
            // SAFETY: a valid layout of non-zero size.
            let p = unsafe { heap.alloc(layout()) };
            if p.is_null() {
                return Err("an allocation failed while measuring");
            }
            // SAFETY: just allocated with this layout, freed once.
            unsafe { heap.dealloc(core::hint::black_box(p), layout()) };
        }
        Ok(ticks() - t0)
    };
    run(OPS)?;
    let one = run(OPS)?;
    Ok(per_op(one, run(2 * OPS)?, tpi))
}

/// Takes every free page of node 0 from `KMEM_NUMA`'s region (after a
/// shrink, so no node-0 slab has room left), largest runs first, and keeps
/// them for the rest of the boot; returns how many.
fn exhaust_node0<A: Arch>() -> usize {
    A::numa_heap().shrink();
    let src = A::numa_heap().source();
    let mut held = 0;
    for order in (0..16).rev() {
        while src.free_pages_on(0) >= 1 << order {
            match src.alloc_pages(order, 0) {
                Some(run) if run.node == 0 => held += 1 << order,
                Some(run) => {
                    // SAFETY: the run just allocated, given back whole.
                    unsafe { src.free_pages(run.addr, order) };
                    break;
                }
                None => break,
            }
        }
    }
    held
}

/// `numa icount`: on the boot CPU (node 0), with the other CPUs parked,
/// guest instructions per local allocation, local free and remote free
/// (of objects a node-1 CPU allocated) on `KMEM_NUMA`, and per allocation
/// and free on the one-node global heap for comparison. `ticks` reads the
/// clock that counts instructions under `-icount`, `tpi` its ticks per
/// instruction.
pub fn measure<A: Arch>(ticks: fn() -> u64, tpi: f64) -> Test {
    let sh = shared::<A>();
    while !sh.ready.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
    if let Some(e) = sh.failure() {
        return Err(e);
    }
    let cells: Vec<AtomicUsize> = (0..2 * OPS).map(|_| AtomicUsize::new(0)).collect();
    let (local_alloc, local_free) = local_costs(A::numa_heap(), &cells, ticks, tpi)?;
    let r = &sh.remote_objects;
    // SAFETY: live node-1 objects of `KMEM_NUMA`, each freed once here.
    let (r1, r2) =
        unsafe { (time_frees(A::numa_heap(), &r[..OPS], ticks), time_frees(A::numa_heap(), &r[OPS..], ticks)) };
    let remote_free = per_op(r1, r2, tpi);
    let pair = pair_cost(A::numa_heap(), ticks, tpi)?;
    let (one_alloc, one_free) = local_costs(A::heap(), &cells, ticks, tpi)?;
    let one_pair = pair_cost(A::heap(), ticks, tpi)?;
    // Remote allocations: node 0 out of pages, CPU 0's slabs come from
    // node 1 (the region's fallback), and their frees are remote too.
    let held = exhaust_node0::<A>();
    let (remote_alloc, remote_alloc_free) = local_costs(A::numa_heap(), &cells, ticks, tpi)?;
    time_allocs(A::numa_heap(), &cells[..OPS], ticks)?;
    let all_remote = cells[..OPS].iter().all(|c| node_of_addr(c.load(Ordering::Relaxed)) == Some(1));
    // SAFETY: just allocated from `KMEM_NUMA`, freed once.
    unsafe { time_frees(A::numa_heap(), &cells[..OPS], ticks) };
    check(all_remote, "with node 0 out of pages, CPU 0 got an object that is not on node 1")?;
    kprintln!(A;
        "numa-icount: two-node heap, cpu 0 (node 0), {OPS}-object batches: local alloc {local_alloc:.2}, local free {local_free:.2}, remote free {remote_free:.2}; alloc+free pair {pair:.2}"
    );
    kprintln!(A;
        "numa-icount: one-node heap, cpu 0, {OPS}-object batches: alloc {one_alloc:.2}, free {one_free:.2}; alloc+free pair {one_pair:.2}"
    );
    kprintln!(A;
        "numa-icount: two-node heap, cpu 0, node 0 out of pages ({held} held): remote alloc {remote_alloc:.2}, free of those {remote_alloc_free:.2}"
    );
    kprintln!(A;
        "numa-icount: ratios: remote/local alloc {:.2}, free {:.2}; two-node/one-node: alloc {:.2}, free {:.2}, pair {:.2}",
        remote_alloc / local_alloc,
        remote_free / local_free,
        local_alloc / one_alloc,
        local_free / one_free,
        pair / one_pair
    );
    kprintln!(A; "numa-icount: done");
    Ok(())
}
