//! The SMP workload, run by every CPU at once with its timer on:
//! collections inside the CPU's own group, a shared typed cache, objects
//! handed to the next CPU and freed there, and a shared group driven to
//! its limit; then the boot CPU's accounting checks. The kernel starts the
//! CPUs, runs their timers and keeps them in step around [`run`].

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::alloc::Layout;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicUsize, Ordering};

use kmemcg::allocator_api2::alloc::Allocator;
use kmemcg::{CacheBox, CacheFlags, Cgroup, Error, KmemCache};

use crate::MAX_CPUS;
use crate::arch::{Arch, Heap, ticks_to_us, us_to_ticks};
use crate::kprintln;
use crate::lock::IrqLock;
use crate::publish::Published;

type Test = Result<(), &'static str>;

/// The shared group's hard limit.
pub const LIMIT: usize = 128 << 10;
/// Each CPU group's hard limit (never reached).
const CPU_GROUP_MAX: usize = 16 << 20;
/// Rounds of the per-group part (collections, own objects, handoff).
const ROUNDS: usize = 10;
/// Messages each CPU sends to the next, per round.
const MESSAGES: usize = 256;
/// Capacity of a CPU's mailbox.
const RING: usize = 16;
/// How long a CPU waits for its messages before it gives up, µs.
const HANDOFF_TIMEOUT_US: u64 = 30_000_000;

fn check(ok: bool, what: &'static str) -> Test {
    if ok { Ok(()) } else { Err(what) }
}

/// An object of the shared typed cache.
pub struct Inode {
    ino: u64,
    owner: u32,
    nlink: u32,
    name: [u8; 24],
}

impl Inode {
    fn new(ino: u64, owner: usize) -> Self {
        Inode { ino, owner: owner as u32, nlink: (ino % 3) as u32, name: [(ino % 251) as u8; 24] }
    }

    fn is(&self, ino: u64, owner: usize) -> bool {
        self.ino == ino
            && self.owner == owner as u32
            && self.nlink == (ino % 3) as u32
            && self.name == [(ino % 251) as u8; 24]
    }
}

/// A message from the global allocator.
struct Token {
    from: usize,
    seq: usize,
    words: [u64; 6],
}

/// What one CPU hands to the next: a global-allocator box or an object
/// of the typed cache, both charged to the sender's group.
enum Msg<C: kmemcg::Cpu> {
    Boxed(Box<Token>),
    Inode(CacheBox<'static, Inode, Heap<C>>),
}

impl<C: kmemcg::Cpu> Msg<C> {
    fn is(&self, from: usize, seq: usize) -> bool {
        match self {
            Msg::Boxed(t) => t.from == from && t.seq == seq && t.words == [(from * 1000 + seq) as u64; 6],
            Msg::Inode(i) => i.is(seq as u64, from),
        }
    }
}

/// A bounded FIFO of messages; it allocates nothing.
struct Ring<C: kmemcg::Cpu> {
    slots: [Option<Msg<C>>; RING],
    head: usize,
    len: usize,
}

impl<C: kmemcg::Cpu> Ring<C> {
    const fn new() -> Self {
        Ring { slots: [const { None }; RING], head: 0, len: 0 }
    }

    fn push(&mut self, m: Msg<C>) -> Result<(), Msg<C>> {
        if self.len == RING {
            return Err(m);
        }
        self.slots[(self.head + self.len) % RING] = Some(m);
        self.len += 1;
        Ok(())
    }

    fn pop(&mut self) -> Option<Msg<C>> {
        let m = self.slots[self.head].take()?;
        self.head = (self.head + 1) % RING;
        self.len -= 1;
        Some(m)
    }
}

/// What one CPU did, for the report.
#[derive(Default)]
pub struct CpuResult {
    /// Typed objects it held in the limited group when the limit held.
    pub limit_objects: AtomicUsize,
    /// 1 KiB blocks it held through the group's `Allocator`.
    pub limit_blocks: AtomicUsize,
    /// Messages it received and freed.
    pub received: AtomicUsize,
    /// Its workload's duration, µs.
    pub elapsed_us: AtomicUsize,
}

/// The state every CPU shares, made by the BSP before the workload and
/// never freed.
pub struct Shared<C: kmemcg::Cpu> {
    /// CPUs taking part.
    pub ncpus: usize,
    /// The typed cache every CPU allocates from.
    pub inodes: KmemCache<'static, Inode, Heap<C>>,
    /// The group every CPU drives to its limit.
    pub limited: Cgroup<'static, Heap<C>>,
    /// `groups[i]`: CPU `i`'s own group, `cpuI`.
    pub groups: Vec<Cgroup<'static, Heap<C>>>,
    mail: Vec<IrqLock<C, Ring<C>>>,
    /// What each CPU did.
    pub results: [CpuResult; MAX_CPUS],
}

/// The [`Shared`] of this boot.
static SHARED: Published = Published::new();

/// Makes the shared state for `ncpus` CPUs (BSP, before the workload).
pub fn setup<A: Arch>(ncpus: usize) -> Result<&'static Shared<A::Cpu>, &'static str> {
    let root = A::heap().root();
    let limited = root.create_child("limited").map_err(|_| "create_child(limited)")?;
    limited.set_max(LIMIT).map_err(|_| "set_max(limited)")?;
    let mut groups = Vec::with_capacity(ncpus);
    for i in 0..ncpus {
        let g = root.create_child(&format!("cpu{i}")).map_err(|_| "create_child(cpuN)")?;
        g.set_max(CPU_GROUP_MAX).map_err(|_| "set_max(cpuN)")?;
        groups.push(g);
    }
    let inodes =
        A::heap().create_cache::<Inode>("inode-smp", CacheFlags::ACCOUNT).map_err(|_| "create_cache(inode-smp)")?;
    let mail = (0..ncpus).map(|_| IrqLock::new(Ring::new())).collect();
    let results = Default::default();
    Ok(SHARED.publish(Shared { ncpus, inodes, limited, groups, mail, results }))
}

/// The shared state, once [`setup`] ran.
pub fn shared<A: Arch>() -> Option<&'static Shared<A::Cpu>> {
    SHARED.get()
}

/// CPU `me`'s part of the workload.
pub fn run<A: Arch>(sh: &'static Shared<A::Cpu>, me: usize) -> Test {
    let group = sh.groups.get(me).ok_or("no group for this CPU")?;
    let start = A::ticks();
    {
        let _in = group.enter();
        for _ in 0..ROUNDS {
            collections(me)?;
            own_inodes::<A>(sh, me, group)?;
            handoff::<A>(sh, me)?;
        }
    }
    limited::<A>(sh, me)?;
    let us = ticks_to_us::<A>(A::ticks() - start);
    sh.results[me].elapsed_us.store(us as usize, Ordering::Relaxed);
    Ok(())
}

/// `Vec`, `BTreeMap`, `String` and `Box`, a few rounds.
fn collections(me: usize) -> Test {
    for round in 0..3u64 {
        let k = me as u64 + round + 1;
        let v: Vec<u64> = (0..2000).map(|i| i * k).collect();
        check(v.iter().sum::<u64>() == k * 2000 * 1999 / 2, "Vec<u64> sum")?;
        // 10007 is prime, so these keys are distinct.
        let key = |i: u32| i * 7919 % 10007;
        let map: BTreeMap<u32, String> = (0..200).map(|i| (key(i), format!("cpu{me}-{i}"))).collect();
        check(map.len() == 200 && (0..200).all(|i| map[&key(i)] == format!("cpu{me}-{i}")), "BTreeMap contents")?;
        let s: String = (0..300).map(|i| char::from(b'a' + ((i + me) % 26) as u8)).collect();
        check(s.len() == 300 && s.as_bytes()[0] == b'a' + (me % 26) as u8, "String contents")?;
        let b: Box<[u64; 128]> = Box::new([k; 128]);
        check(b.iter().sum::<u64>() == 128 * k, "Box<[u64; 128]>")?;
    }
    Ok(())
}

/// Typed-cache objects charged to this CPU's group (entered).
fn own_inodes<A: Arch>(sh: &'static Shared<A::Cpu>, me: usize, group: &Cgroup<'static, Heap<A::Cpu>>) -> Test {
    let mut live = Vec::with_capacity(400);
    for i in 0..400u64 {
        live.push(sh.inodes.alloc(Inode::new(i, me)).map_err(|_| "inode-smp allocation")?);
    }
    check(live.iter().enumerate().all(|(i, n)| n.is(i as u64, me)), "inode-smp contents")?;
    check(group.usage() > 0, "a CPU group's usage stayed 0 while it held objects")?;
    live.truncate(100);
    check(live.iter().enumerate().all(|(i, n)| n.is(i as u64, me)), "inode-smp contents after frees")
}

/// Sends `MESSAGES` to the next CPU's mailbox and frees as many from the
/// previous CPU's, interleaved.
fn handoff<A: Arch>(sh: &'static Shared<A::Cpu>, me: usize) -> Test {
    let n = sh.ncpus;
    let (to, from) = ((me + 1) % n, (me + n - 1) % n);
    let (mut sent, mut got) = (0, 0);
    let mut pending: Option<Msg<A::Cpu>> = None;
    let deadline = A::ticks() + us_to_ticks::<A>(HANDOFF_TIMEOUT_US);
    while sent < MESSAGES || got < MESSAGES {
        if pending.is_none() && sent < MESSAGES {
            pending = Some(if sent % 2 == 0 {
                Msg::Boxed(Box::new(Token { from: me, seq: sent, words: [(me * 1000 + sent) as u64; 6] }))
            } else {
                Msg::Inode(sh.inodes.alloc(Inode::new(sent as u64, me)).map_err(|_| "inode-smp allocation")?)
            });
        }
        if let Some(m) = pending.take() {
            match sh.mail[to].with(|r| r.push(m)) {
                Ok(()) => sent += 1,
                Err(m) => pending = Some(m),
            }
        }
        // Only this round's messages: the sender may be a round ahead.
        if let Some(m) = (got < MESSAGES).then(|| sh.mail[me].with(Ring::pop)).flatten() {
            if !m.is(from, got) {
                match &m {
                    Msg::Boxed(t) => kprintln!(A;
                        "handoff: index {me} expected seq {got} from {from}, got box at {:p}: from {} seq {} words {:x?}",
                        &**t,
                        t.from,
                        t.seq,
                        t.words
                    ),
                    Msg::Inode(i) => kprintln!(A;
                        "handoff: index {me} expected seq {got} from {from}, got inode at {:p}: ino {} owner {} nlink {} name {:?}",
                        &**i,
                        i.ino,
                        i.owner,
                        i.nlink,
                        &i.name[..4]
                    ),
                }
                return Err("a handed-off object arrived changed or out of order");
            }
            drop(m); // freed here, allocated on `from`
            got += 1;
        }
        if A::ticks() > deadline {
            let ring = sh.mail[me].with(|r| r.len);
            kprintln!(A;
                "handoff: index {me} timed out: sent {sent}, got {got}, pending {}, own mailbox {ring}",
                pending.is_some()
            );
            return Err("handoff timed out");
        }
    }
    sh.results[me].received.fetch_add(got, Ordering::Relaxed);
    Ok(())
}

/// Allocates in the shared limited group until its limit holds: typed
/// objects (`alloc_in`), then 1 KiB blocks through its `Allocator`.
fn limited<A: Arch>(sh: &'static Shared<A::Cpu>, me: usize) -> Test {
    let cap = LIMIT / size_of::<Inode>() + 1;
    let mut held = Vec::with_capacity(cap);
    let err = loop {
        if held.len() == cap {
            return Err("limited: more objects than its max allows");
        }
        match sh.inodes.alloc_in(&sh.limited, Inode::new(held.len() as u64, me)) {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
    };
    match err {
        Error::LimitExceeded { group, max } if group.as_str() == "limited" && max == LIMIT => {}
        _ => return Err("limited: failed with something other than its own LimitExceeded"),
    }
    check(held.iter().enumerate().all(|(i, n)| n.is(i as u64, me)), "limited: object contents")?;
    sh.results[me].limit_objects.store(held.len(), Ordering::Relaxed);
    drop(held);

    let a = sh.limited.allocator();
    let layout = Layout::from_size_align(1024, 8).map_err(|_| "layout")?;
    let cap = LIMIT / 1024 + 1;
    let mut blocks: Vec<NonNull<[u8]>> = Vec::with_capacity(cap);
    while let Ok(p) = a.allocate(layout) {
        if blocks.len() == cap {
            // SAFETY: just allocated by `a` with `layout`.
            unsafe { a.deallocate(p.cast(), layout) };
            return Err("limited: more blocks than its max allows");
        }
        // SAFETY: `p` is a fresh block of at least 1024 bytes.
        unsafe { p.cast::<u8>().write_bytes(me as u8, 1024) };
        blocks.push(p);
    }
    sh.results[me].limit_blocks.store(blocks.len(), Ordering::Relaxed);
    for p in blocks {
        // SAFETY: allocated by `a` with `layout`, freed once.
        unsafe { a.deallocate(p.cast(), layout) };
    }
    Ok(())
}

/// After every CPU finished (timers stopped): empties every magazine and
/// stock, then checks that every group is back to zero, that only the
/// limited group failed, and that the root is back where it was.
pub fn check_accounting<A: Arch>(sh: &'static Shared<A::Cpu>, root_before: usize, pages_before: usize) -> Test {
    for (i, r) in sh.results.iter().enumerate().take(sh.ncpus) {
        kprintln!(A;
            "workload: index {i}: {} ms, {} messages freed from index {}, limited group held {} objects, then {} blocks",
            r.elapsed_us.load(Ordering::Relaxed) / 1000,
            r.received.load(Ordering::Relaxed),
            (i + sh.ncpus - 1) % sh.ncpus,
            r.limit_objects.load(Ordering::Relaxed),
            r.limit_blocks.load(Ordering::Relaxed)
        );
    }
    let pages = A::heap().shrink();
    kprintln!(A; "shrink: {pages} pages given back");
    for g in &sh.groups {
        let st = g.stat();
        kprintln!(A;
            "group {}: usage {} KiB, peak {} KiB, failcnt {}, max events {}",
            g.name(),
            st.usage >> 10,
            st.peak >> 10,
            st.failcnt,
            st.events.max
        );
        check(st.usage == 0, "a CPU group's usage is not back to zero")?;
        check(st.peak > 0, "a CPU group was never charged")?;
        check(st.failcnt == 0 && st.events.max == 0 && st.events.oom == 0, "a CPU group saw failures")?;
    }
    let st = sh.limited.stat();
    kprintln!(A;
        "group limited: usage {} KiB, peak {} KiB, max {} KiB, failcnt {}, max events {}, oom events {}",
        st.usage >> 10,
        st.peak >> 10,
        st.max >> 10,
        st.failcnt,
        st.events.max,
        st.events.oom
    );
    check(st.usage == 0, "the limited group's usage is not back to zero")?;
    check(st.peak <= LIMIT, "the limited group went past its max")?;
    check(st.failcnt > 0 && st.events.max > 0, "the limited group never failed")?;
    let root = A::heap().root();
    let after = root.usage();
    kprintln!(A;
        "group /: usage {} KiB before the workload, {} KiB after, failcnt {}; source pages in use {} before, {} after",
        root_before >> 10,
        after >> 10,
        root.failcnt(),
        pages_before,
        A::heap().stats().source.pages_in_use
    );
    check(root.failcnt() == 0, "the root saw failures")?;
    check(after == root_before, "the root's usage changed across the workload")?;
    check(A::heap().stats().bad_frees == 0, "kmemcg saw frees of pointers it does not own")
}

/// Removes the workload's groups.
pub fn remove_groups<A: Arch>(sh: &'static Shared<A::Cpu>) -> Test {
    for g in sh.groups.iter().chain([&sh.limited]) {
        g.remove().map_err(|_| "removing a workload group")?;
        check(g.is_removed(), "a workload group is not removed")?;
    }
    A::heap().shrink();
    kprintln!(A;
        "groups: limited and cpu0..cpu{} removed (their handles stay); source pages in use {}",
        sh.ncpus - 1,
        A::heap().stats().source.pages_in_use
    );
    Ok(())
}
