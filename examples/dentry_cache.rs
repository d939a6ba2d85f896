//! Run with: `cargo run --release --example dentry_cache [PATH]`
//!
//! Seed 000 made real. Glauber Costa's 2011 kmem-cgroup sketch limited a
//! cgroup's dentry cache and timed `find /` under halving hard limits: the
//! time grew only mildly, because dentries were reclaimed instead of
//! allocations failing. Here a tree (default `/usr`) is walked with
//! `std::fs`, one 192-byte dentry per entry from the accounted typed cache
//! `dentry`, charged to the group `find`. Unused dentries sit on an LRU,
//! and a registered [`Shrinker`] evicts from its cold end (with Linux's
//! second chance for referenced ones) when the group hits its `max`, so the
//! walk carries on under every limit instead of failing.
//!
//! The walk reads each directory whole, sorted, and makes a dentry for
//! every entry (it `lstat`s each, as the kernel's lookups would), then
//! descends into the subdirectories in order. As in Linux, a dentry pins
//! its parent, the walker pins the directories on its current path, and
//! only unpinned dentries are on the LRU; a subdirectory whose dentry was
//! evicted before the walk got to it is looked up (allocated) again. The
//! walk stays on one filesystem and never follows symlinks.
//!
//! Passes: an unaccounted cache (the seed's unpatched kernel), the group
//! without a limit, then its `max` at 1/2, 1/4 ... 1/64 of the unlimited
//! peak. Each prints wall, user and system time, the dentries created,
//! evicted by the shrinker and looked up again, failed allocations (none),
//! the peak charge, the charges that hit `max`, and the shrinker's calls,
//! beside the seed's row of the same rank (its limits ran from 16M down to
//! 512K of a 22M peak). An untimed warm-up walk in the group comes first:
//! it warms the kernel's caches, sizes the tree and measures the peak the
//! limits are halved from. Times are medians of up to five rounds, the
//! pass order rotating between rounds. A tree of fewer than 50,000 entries
//! is walked several times per pass (as separate mounts); one the warm-up
//! cannot walk in 4 s is cut where it stopped, so a run stays well under
//! a minute.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use kmemcg::{CacheBox, CacheFlags, Cgroup, GroupId, Kmem, KmemCache, OsPages, PAGE_SIZE, ShrinkControl, Shrinker};

#[global_allocator]
static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

type Cache = KmemCache<'static, Dentry, Kmem<OsPages>>;
type DBox = CacheBox<'static, Dentry, Kmem<OsPages>>;

/// Halvings of the unlimited peak tried as limits (1/2 .. 1/64).
const STEPS: u32 = 6;
/// A pass walks the tree again (as another mount) until it has this many
/// entries, so a small tree still makes a meaningful pass.
const MIN_ENTRIES: usize = 50_000;
/// At most this many entries per pass.
const MAX_ENTRIES: usize = 400_000;
/// If the warm-up walk takes longer, passes stop at the entries it reached.
const PASS_BUDGET: Duration = Duration::from_secs(4);

/// Rounds of all passes at most; times are their medians.
const MAX_ROUNDS: usize = 5;
/// No new round is started that would end past this.
const TOTAL_BUDGET: Duration = Duration::from_secs(40);

/// Seed 000 (Glauber Costa, "What does glommer think about kmem cgroup ?",
/// devel@openvz.org, 13 Oct 2011; ../shared/seeds/000_f53bc6c9938c24d6.txt):
/// `find /` on his laptop, one run each, as (setting, real, user, sys) in
/// seconds. Limits are hard/soft; max used memory unlimited was 22 MB.
const SEED: [(&str, f64, f64, f64); 8] = [
    ("unpatched kernel", 16.091, 0.567, 6.649),
    ("root cgroup (22M)", 15.853, 0.511, 6.417),
    ("16M/4M", 16.596, 0.560, 6.947),
    ("8M/4M", 16.975, 0.568, 7.047),
    ("4M/2M", 16.713, 0.554, 7.022),
    ("2M/1M", 17.001, 0.544, 7.118),
    ("1M/512K", 16.671, 0.530, 7.067),
    ("512K/256K", 17.395, 0.567, 7.179),
];

// ---------------------------------------------------------------- dentry

/// No slot (a root's parent, an empty list).
const NONE: u32 = u32::MAX;
/// Linux `DNAME_INLINE_LEN` on 64-bit: longer names are kept truncated
/// here (the kernel would allocate them outside the dentry).
const DNAME_INLINE_LEN: usize = 40;
/// Used since it went on the LRU: the shrinker gives it a second chance.
const DCACHE_REFERENCED: u16 = 1;
/// On the LRU.
const DCACHE_LRU: u16 = 2;

/// A dentry-like object, the size of a Linux dentry (192 bytes). Links are
/// slots of the [`Dcache`] table, so no pointer dangles when one is freed.
#[allow(dead_code)] // the inode fields and `_kernel` are payload, never read
struct Dentry {
    /// Hash of the name, salted with the parent's (`d_name.hash`).
    hash: u64,
    /// Creation number: tells a reused slot from the dentry a walker named.
    seq: u64,
    /// From `lstat`: inode number, size, modification time, mode.
    ino: u64,
    size: u64,
    mtime: i64,
    mode: u32,
    /// `d_parent`, pinned by this dentry.
    parent: u32,
    /// `d_lru`.
    lru_prev: u32,
    lru_next: u32,
    /// `d_lockref.count`: cached children plus the walker's pin.
    refs: u32,
    flags: u16,
    /// The name's full length; `name` holds at most `DNAME_INLINE_LEN`.
    name_len: u16,
    name: [u8; DNAME_INLINE_LEN],
    /// Stands in for what a kernel dentry holds besides (superblock, ops,
    /// fs data, hash-chain and child-list links, RCU head).
    _kernel: [u64; 11],
}

const _: () = assert!(size_of::<Dentry>() == 192);

/// FNV-1a over `name`, starting from the parent's hash.
fn name_hash(parent: u64, name: &[u8]) -> u64 {
    name.iter().fold(parent ^ 0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

// ---------------------------------------------------------------- dcache

/// A slot of the dcache table: a dentry, or a link in the free list.
enum Slot {
    Free(u32),
    Live(DBox),
}

/// The dentries of a pass: a table of owning boxes (the table itself is
/// allocated in the root group, only the dentries are charged to `find`),
/// with an intrusive LRU through `lru_prev`/`lru_next` and a free list
/// through the empty slots, so that the shrinker never allocates.
struct Dcache {
    slots: Vec<Slot>,
    free: u32,
    lru_head: u32,
    lru_tail: u32,
    lru_len: usize,
}

impl Dcache {
    const fn new() -> Self {
        Dcache { slots: Vec::new(), free: NONE, lru_head: NONE, lru_tail: NONE, lru_len: 0 }
    }

    fn d(&mut self, i: u32) -> Option<&mut Dentry> {
        match self.slots.get_mut(i as usize) {
            Some(Slot::Live(b)) => Some(&mut **b),
            _ => None,
        }
    }

    fn alive(&mut self, i: u32, seq: u64) -> bool {
        self.d(i).is_some_and(|d| d.seq == seq)
    }

    fn insert(&mut self, b: DBox) -> u32 {
        if let Some(&Slot::Free(next)) = self.slots.get(self.free as usize) {
            let i = self.free;
            self.free = next;
            self.slots[i as usize] = Slot::Live(b);
            i
        } else {
            self.slots.push(Slot::Live(b));
            (self.slots.len() - 1) as u32
        }
    }

    /// Takes dentry `i` out of the table (and off the LRU).
    fn remove(&mut self, i: u32) -> Option<DBox> {
        self.lru_del(i);
        let slot = self.slots.get_mut(i as usize)?;
        match std::mem::replace(slot, Slot::Free(self.free)) {
            Slot::Live(b) => {
                self.free = i;
                Some(b)
            }
            free => {
                *slot = free;
                None
            }
        }
    }

    /// Appends `i` at the LRU's warm end.
    fn lru_add(&mut self, i: u32) {
        let tail = self.lru_tail;
        let Some(d) = self.d(i) else { return };
        if d.flags & DCACHE_LRU != 0 {
            return;
        }
        d.flags |= DCACHE_LRU;
        d.lru_prev = tail;
        d.lru_next = NONE;
        match self.d(tail) {
            Some(t) => t.lru_next = i,
            None => self.lru_head = i,
        }
        self.lru_tail = i;
        self.lru_len += 1;
    }

    fn lru_del(&mut self, i: u32) {
        let Some(d) = self.d(i) else { return };
        if d.flags & DCACHE_LRU == 0 {
            return;
        }
        d.flags &= !DCACHE_LRU;
        let (prev, next) = (d.lru_prev, d.lru_next);
        match self.d(prev) {
            Some(p) => p.lru_next = next,
            None => self.lru_head = next,
        }
        match self.d(next) {
            Some(n) => n.lru_prev = prev,
            None => self.lru_tail = prev,
        }
        self.lru_len -= 1;
    }

    /// `dget`: a pinned dentry leaves the LRU.
    fn get(&mut self, i: u32) {
        if let Some(d) = self.d(i) {
            d.refs += 1;
        }
        self.lru_del(i);
    }

    /// `dput`: the last reference puts it on the LRU.
    fn put(&mut self, i: u32) {
        let Some(d) = self.d(i) else { return };
        d.refs = d.refs.saturating_sub(1);
        if d.refs == 0 {
            self.lru_add(i);
        }
    }

    /// Linux's `prune_dcache_sb`: walks up to `nr` dentries from the cold
    /// end, rotating referenced ones once and freeing the others (which
    /// may put their parents on the LRU). Returns (freed, rotated).
    fn prune(&mut self, nr: usize) -> (usize, usize) {
        let (mut freed, mut rotated) = (0, 0);
        for _ in 0..nr {
            let i = self.lru_head;
            let Some(d) = self.d(i) else { break };
            if d.flags & DCACHE_REFERENCED != 0 || d.refs > 0 {
                d.flags &= !DCACHE_REFERENCED;
                let pinned = d.refs > 0;
                self.lru_del(i);
                if !pinned {
                    self.lru_add(i);
                }
                rotated += 1;
                continue;
            }
            let parent = d.parent;
            // Dropping the box frees the object into the group's cache;
            // its slab's pages are uncharged when the slab goes back.
            drop(self.remove(i));
            freed += 1;
            self.put(parent);
        }
        (freed, rotated)
    }
}

static DCACHE: Mutex<Dcache> = Mutex::new(Dcache::new());

fn dcache() -> MutexGuard<'static, Dcache> {
    DCACHE.lock().unwrap_or_else(|e| e.into_inner())
}

// -------------------------------------------------------------- shrinker

/// The dcache's shrinker. Reclaim calls it from the allocating thread, in
/// the middle of a `dentry` allocation that hit the limit, with no
/// allocator lock held: it may free dentries but must not allocate. The
/// walker never holds the dcache lock while it allocates a dentry, and the
/// shrinker only `try_lock`s it, so it can never deadlock on it.
///
/// It is not node-aware: it answers for node 0 only and frees dentries
/// wherever they are (Linux calls such shrinkers for node 0 only too).
struct DentryShrinker {
    group: OnceLock<GroupId>,
    counts: AtomicUsize,
    scans: AtomicUsize,
    asked: AtomicUsize,
    freed: AtomicUsize,
    rotated: AtomicUsize,
    busy: AtomicUsize,
}

static SHRINKER: DentryShrinker = DentryShrinker {
    group: OnceLock::new(),
    counts: AtomicUsize::new(0),
    scans: AtomicUsize::new(0),
    asked: AtomicUsize::new(0),
    freed: AtomicUsize::new(0),
    rotated: AtomicUsize::new(0),
    busy: AtomicUsize::new(0),
};

/// Shrinker calls during one pass.
#[derive(Clone, Copy, Default)]
struct ShrinkStats {
    counts: usize,
    scans: usize,
    asked: usize,
    freed: usize,
    rotated: usize,
    busy: usize,
}

impl DentryShrinker {
    fn in_scope(&self, sc: &ShrinkControl) -> bool {
        sc.node() == 0 && self.group.get().is_some_and(|g| sc.contains(*g))
    }

    fn try_dcache(&self) -> Option<MutexGuard<'static, Dcache>> {
        match DCACHE.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => {
                self.busy.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The counters since the last call, which restarts them.
    fn take(&self) -> ShrinkStats {
        let t = |a: &AtomicUsize| a.swap(0, Ordering::Relaxed);
        ShrinkStats {
            counts: t(&self.counts),
            scans: t(&self.scans),
            asked: t(&self.asked),
            freed: t(&self.freed),
            rotated: t(&self.rotated),
            busy: t(&self.busy),
        }
    }
}

impl Shrinker for DentryShrinker {
    fn count(&self, sc: &ShrinkControl) -> usize {
        if !self.in_scope(sc) {
            return 0;
        }
        self.counts.fetch_add(1, Ordering::Relaxed);
        self.try_dcache().map_or(0, |dc| dc.lru_len)
    }

    fn scan(&self, sc: &ShrinkControl, nr: usize) -> usize {
        if !self.in_scope(sc) {
            return 0;
        }
        self.scans.fetch_add(1, Ordering::Relaxed);
        self.asked.fetch_add(nr, Ordering::Relaxed);
        let Some(mut dc) = self.try_dcache() else { return 0 };
        let (freed, rotated) = dc.prune(nr);
        self.freed.fetch_add(freed, Ordering::Relaxed);
        self.rotated.fetch_add(rotated, Ordering::Relaxed);
        freed
    }
}

// ------------------------------------------------------------------ walk

/// A dentry as the walker names it: slot, creation number, name hash.
#[derive(Clone, Copy)]
struct DRef {
    slot: u32,
    seq: u64,
    hash: u64,
}

/// What `lstat` said about an entry.
struct Inode {
    ino: u64,
    size: u64,
    mtime: i64,
    mode: u32,
}

struct Entry {
    name: OsString,
    inode: Inode,
    /// A directory on the walk's filesystem (symlinks never are).
    dir: bool,
    dentry: Option<DRef>,
}

/// A directory being walked: its pinned dentry and its sorted entries.
struct Frame {
    path: PathBuf,
    dentry: DRef,
    entries: Vec<Entry>,
    next: usize,
}

#[derive(Default)]
struct WalkStats {
    entries: usize,
    dirs: usize,
    created: usize,
    relookups: usize,
    hits: usize,
    failed: usize,
    unreadable: usize,
    first_error: Option<kmemcg::Error>,
}

struct Walk<'a> {
    /// `'static`: the dcache keeps its boxes across calls.
    cache: &'static Cache,
    /// The group dentries are charged to, with `alloc_in` (`None`: none).
    group: Option<&'a Cgroup<'static, Kmem<OsPages>>>,
    dev: u64,
    bound: usize,
    deadline: Option<Instant>,
    seq: u64,
    st: WalkStats,
}

impl Walk<'_> {
    fn done(&self) -> bool {
        self.st.entries >= self.bound || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// `d_alloc`: a new dentry for `name` under `parent` (`NONE`: a root),
    /// pinned by the caller if `pin`, else on the LRU.
    fn d_alloc(&mut self, parent: Option<DRef>, name: &OsStr, inode: &Inode, pin: bool) -> Option<DRef> {
        self.seq += 1;
        let bytes = name.as_bytes();
        let hash = name_hash(parent.map_or(0, |p| p.hash), bytes);
        let mut inline = [0u8; DNAME_INLINE_LEN];
        let n = bytes.len().min(DNAME_INLINE_LEN);
        inline[..n].copy_from_slice(&bytes[..n]);
        let d = Dentry {
            hash,
            seq: self.seq,
            ino: inode.ino,
            size: inode.size,
            mtime: inode.mtime,
            mode: inode.mode,
            parent: parent.map_or(NONE, |p| p.slot),
            lru_prev: NONE,
            lru_next: NONE,
            refs: 0,
            flags: 0,
            name_len: bytes.len().min(u16::MAX as usize) as u16,
            name: inline,
            _kernel: [0; 11],
        };
        // Only the dentry is charged to the group, and the dcache lock is
        // not held: a charge over `max` runs the shrinker right here.
        let r = match self.group {
            Some(g) => self.cache.alloc_in(g, d),
            None => self.cache.alloc(d),
        };
        let b = match r {
            Ok(b) => b,
            Err(e) => {
                self.st.failed += 1;
                self.st.first_error.get_or_insert(e);
                return None;
            }
        };
        self.st.created += 1;
        let mut dc = dcache();
        let i = dc.insert(b);
        if let Some(p) = parent {
            dc.get(p.slot);
        }
        if pin {
            dc.get(i);
        } else {
            dc.lru_add(i);
        }
        Some(DRef { slot: i, seq: self.seq, hash })
    }

    /// The pinned dentry of subdirectory `e` of `parent`: a hit if it is
    /// still cached, else looked up (allocated) again.
    fn lookup(&mut self, parent: DRef, e: &Entry) -> Option<DRef> {
        if let Some(r) = e.dentry {
            let mut dc = dcache();
            if dc.alive(r.slot, r.seq) {
                dc.get(r.slot);
                if let Some(d) = dc.d(r.slot) {
                    d.flags |= DCACHE_REFERENCED;
                }
                self.st.hits += 1;
                return Some(r);
            }
        }
        self.st.relookups += 1;
        self.d_alloc(Some(parent), &e.name, &e.inode, true)
    }

    /// Reads directory `path` (whose dentry `d` the caller pinned), sorted,
    /// with a dentry per entry.
    fn open(&mut self, path: PathBuf, d: DRef) -> Frame {
        self.st.dirs += 1;
        let mut entries = Vec::new();
        match fs::read_dir(&path) {
            Ok(rd) => {
                for e in rd {
                    // Skip what cannot be read or has vanished meanwhile.
                    let Ok(e) = e else {
                        self.st.unreadable += 1;
                        continue;
                    };
                    // `DirEntry::metadata` does not follow symlinks.
                    let Ok(md) = e.metadata() else {
                        self.st.unreadable += 1;
                        continue;
                    };
                    entries.push(Entry {
                        name: e.file_name(),
                        inode: Inode { ino: e.ino(), size: md.size(), mtime: md.mtime(), mode: md.mode() },
                        dir: md.is_dir() && md.dev() == self.dev,
                        dentry: None,
                    });
                }
            }
            Err(_) => self.st.unreadable += 1,
        }
        entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        entries.truncate(self.bound.saturating_sub(self.st.entries));
        self.st.entries += entries.len();
        for e in &mut entries {
            e.dentry = self.d_alloc(Some(d), &e.name, &e.inode, false);
        }
        Frame { path, dentry: d, entries, next: 0 }
    }

    /// Walks the tree at `root` depth first, in name order.
    fn walk(&mut self, root: &Path, md: &fs::Metadata) {
        let inode = Inode { ino: md.ino(), size: md.size(), mtime: md.mtime(), mode: md.mode() };
        let Some(rd) = self.d_alloc(None, root.as_os_str(), &inode, true) else { return };
        let mut stack = vec![self.open(root.to_path_buf(), rd)];
        while let Some(top) = stack.last_mut() {
            let next = if self.done() {
                None
            } else {
                top.entries[top.next..].iter().position(|e| e.dir).map(|k| top.next + k)
            };
            let Some(k) = next else {
                let dentry = top.dentry.slot;
                stack.pop();
                dcache().put(dentry);
                continue;
            };
            top.next = k + 1;
            let (parent, path) = (top.dentry, top.path.join(&top.entries[k].name));
            let e = &top.entries[k];
            if let Some(d) = self.lookup(parent, e) {
                let frame = self.open(path, d);
                stack.push(frame);
            }
        }
    }
}

// ---------------------------------------------------------------- passes

fn cpu_times() -> (Duration, Duration) {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `rusage` to the buffer, which is one.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    // SAFETY: zeroed, then filled in by the successful call.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| Duration::from_micros(t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

struct Row {
    label: String,
    real: Duration,
    user: Duration,
    sys: Duration,
    walk: WalkStats,
    shrink: ShrinkStats,
    /// Peak bytes charged (`None` for the unaccounted pass).
    peak: usize,
    events_max: usize,
    /// The group's limit during the pass, bytes.
    max: usize,
    /// Counts differed between rounds.
    varied: bool,
}

/// The tree, how often a pass walks it, and where a pass stops.
struct Plan {
    root: PathBuf,
    md: fs::Metadata,
    reps: usize,
    bound: usize,
}

/// One timed pass: the walks, then the dcache emptied (untimed).
fn pass(label: String, cache: &'static Cache, group: Option<&Cgroup<'static, Kmem<OsPages>>>, plan: &Plan) -> Row {
    let ev0 = group.map_or(0, |g| g.stat().events.max);
    if let Some(g) = group {
        g.reset_peak();
    }
    SHRINKER.take();
    let (u0, s0) = cpu_times();
    let t0 = Instant::now();
    let mut w =
        Walk { cache, group, dev: plan.md.dev(), bound: plan.bound, deadline: None, seq: 0, st: WalkStats::default() };
    for _ in 0..plan.reps {
        if w.done() {
            break;
        }
        w.walk(&plan.root, &plan.md);
    }
    let real = t0.elapsed();
    let (u1, s1) = cpu_times();
    let shrink = SHRINKER.take();
    let peak = match group {
        Some(g) => g.peak(),
        // Nothing is freed in an unlimited pass: what the cache holds now.
        None => cache.stats().pages * PAGE_SIZE,
    };
    let events_max = group.map_or(0, |g| g.stat().events.max - ev0);
    let max = group.map_or(usize::MAX, |g| g.max());
    teardown(cache);
    Row {
        label,
        real,
        user: u1.saturating_sub(u0),
        sys: s1.saturating_sub(s0),
        walk: w.st,
        shrink,
        peak,
        events_max,
        max,
        varied: false,
    }
}

/// Frees every dentry and gives the cache's empty slabs back.
fn teardown(cache: &Cache) {
    let old = std::mem::replace(&mut *dcache(), Dcache::new());
    drop(old);
    cache.shrink();
}

fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 { format!("{:.1}M", bytes as f64 / (1 << 20) as f64) } else { format!("{}K", bytes >> 10) }
}

fn pct(x: f64, base: f64) -> String {
    format!("{:+.0}%", (x / base - 1.0) * 100.0)
}

fn main() -> ExitCode {
    let root = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "/usr".into()));
    let md = match fs::symlink_metadata(&root) {
        Ok(md) if md.is_dir() => md,
        Ok(_) => {
            eprintln!("dentry_cache: {} is not a directory", root.display());
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("dentry_cache: {}: {e}", root.display());
            return ExitCode::FAILURE;
        }
    };
    let (base, dentry, group) = match setup() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("dentry_cache: setup failed: {e}");
            return ExitCode::FAILURE;
        }
    };

    // Warm-up: the kernel's caches, the size of the tree, and the group's
    // peak without a limit, from which the limits are derived.
    let t = Instant::now();
    group.reset_peak();
    let mut w = Walk {
        cache: dentry,
        group: Some(&group),
        dev: md.dev(),
        bound: MAX_ENTRIES,
        deadline: Some(t + PASS_BUDGET),
        seq: 0,
        st: WalkStats::default(),
    };
    w.walk(&root, &md);
    let (entries, dirs, cut) = (w.st.entries, w.st.dirs, w.done());
    let mut peak = group.peak();
    teardown(dentry);
    if entries == 0 {
        eprintln!("dentry_cache: nothing to walk under {}", root.display());
        return ExitCode::FAILURE;
    }
    let reps = if cut { 1 } else { MIN_ENTRIES.div_ceil(entries) };
    let plan = Plan { root, md, reps, bound: (entries * reps).min(MAX_ENTRIES) };
    if reps > 1 {
        peak = pass(String::new(), dentry, Some(&group), &plan).peak;
    }
    println!(
        "walking {} (one filesystem, symlinks not followed): {entries} entries in {dirs} directories{}, \
         warm-up {:.2}s",
        plan.root.display(),
        if cut { " (cut: passes stop there)" } else { "" },
        t.elapsed().as_secs_f64()
    );
    println!(
        "{} walk(s) per pass, {} entries; dentry {} bytes, {} per slab page; group `find`, LRU shrinker; \
         pass order rotating between rounds\n",
        plan.reps,
        plan.bound,
        size_of::<Dentry>(),
        (PAGE_SIZE - 64) / size_of::<Dentry>()
    );

    // (label, cache, group, limit) per pass: the seed's rows.
    let mut modes = vec![("unaccounted".to_string(), base, None, usize::MAX)];
    modes.push(("unlimited".into(), dentry, Some(&group), usize::MAX));
    for k in 1..=STEPS {
        let limit = (peak >> k) / PAGE_SIZE * PAGE_SIZE;
        modes.push((format!("1/{} {}", 1 << k, size(limit)), dentry, Some(&group), limit));
    }
    let mut rounds: Vec<Vec<Row>> = Vec::new();
    let started = Instant::now();
    for round in 0..MAX_ROUNDS {
        let mut rows: Vec<Option<Row>> = modes.iter().map(|_| None).collect();
        for j in 0..modes.len() {
            let i = (j + round) % modes.len();
            let (label, cache, g, limit) = &modes[i];
            // Usage is back to zero between passes, so this is not refused.
            if let Err(e) = group.set_max(*limit) {
                eprintln!("dentry_cache: set_max({limit}): {e}");
            }
            rows[i] = Some(pass(label.clone(), cache, *g, &plan));
        }
        rounds.push(rows.into_iter().flatten().collect());
        let per_round = started.elapsed() / rounds.len() as u32;
        if started.elapsed() + per_round > TOTAL_BUDGET {
            break;
        }
    }
    let nrounds = rounds.len();
    if let Err(e) = group.set_max(usize::MAX) {
        eprintln!("dentry_cache: set_max: {e}");
    }
    let rows = merge(rounds);

    print_table(&rows, nrounds);
    KMEM.unregister_shrinker(&SHRINKER);
    let failed: usize = rows.iter().map(|r| r.walk.failed).sum();
    if let Err(e) = group.remove() {
        eprintln!("dentry_cache: removing the group: {e}");
    }
    if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// The unaccounted and the accounted cache (both kept for the program's
/// life), the group, and the registered shrinker.
fn setup() -> Result<(&'static Cache, &'static Cache, Cgroup<'static, Kmem<OsPages>>), kmemcg::Error> {
    let base: &'static Cache = Box::leak(Box::new(KMEM.create_cache::<Dentry>("dentry-base", CacheFlags::NONE)?));
    let dentry: &'static Cache = Box::leak(Box::new(KMEM.create_cache::<Dentry>("dentry", CacheFlags::ACCOUNT)?));
    let group = KMEM.root().create_child("find")?;
    let _ = SHRINKER.group.set(group.id());
    KMEM.register_shrinker(&SHRINKER)?;
    Ok((base, dentry, group))
}

/// Round 0's rows with each time replaced by the median over the rounds;
/// `varied` marks a pass whose counts were not the same in every round.
fn merge(mut rounds: Vec<Vec<Row>>) -> Vec<Row> {
    let counts = |r: &Row| {
        (r.walk.created, r.walk.relookups, r.walk.failed, r.shrink.freed, r.shrink.scans, r.events_max, r.peak)
    };
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let mut rows = rounds.remove(0);
    for (i, r) in rows.iter_mut().enumerate() {
        let others: Vec<&Row> = rounds.iter().filter_map(|rs| rs.get(i)).collect();
        r.varied = others.iter().any(|o| counts(o) != counts(r));
        r.real = median(others.iter().map(|o| o.real).chain([r.real]).collect());
        r.user = median(others.iter().map(|o| o.user).chain([r.user]).collect());
        r.sys = median(others.iter().map(|o| o.sys).chain([r.sys]).collect());
    }
    rows
}

fn print_table(rows: &[Row], nrounds: usize) {
    println!(
        "{:<14} {:>7} {:>6} {:>6} {:>6} | {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} | {:<17} {:>7} {:>6} {:>6}",
        "pass",
        "real",
        "user",
        "sys",
        "vs unl",
        "created",
        "evicted",
        "relook",
        "failed",
        "peak",
        "ev_max",
        "counts",
        "scans",
        "seed 000: find /",
        "real",
        "sys",
        "vs root"
    );
    let unl = rows.get(1).map_or(1.0, |r| r.real.as_secs_f64());
    for (i, r) in rows.iter().enumerate() {
        let (name, real, _user, sys) = SEED.get(i).copied().unwrap_or(("", 0.0, 0.0, 0.0));
        let seed_vs = if i == 1 || name.is_empty() { "-".into() } else { pct(real, SEED[1].1) };
        println!(
            "{:<14} {:>6.2}s {:>5.2}s {:>5.2}s {:>6} | {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} | {:<17} {:>6.2}s {:>5.2}s {:>6}",
            r.label,
            r.real.as_secs_f64(),
            r.user.as_secs_f64(),
            r.sys.as_secs_f64(),
            if i == 1 { "-".into() } else { pct(r.real.as_secs_f64(), unl) },
            r.walk.created,
            r.shrink.freed,
            r.walk.relookups,
            r.walk.failed,
            size(r.peak),
            if i == 0 { "-".into() } else { r.events_max.to_string() },
            r.shrink.counts,
            r.shrink.scans,
            name,
            real,
            sys,
            seed_vs
        );
    }
    println!("\ntimes are medians of {nrounds} round(s); counts are the same in every round unless noted");
    for r in rows {
        if let Some(e) = r.walk.first_error {
            println!("{}: {} allocations failed, the first with: {e}", r.label, r.walk.failed);
        }
        if r.shrink.busy > 0 {
            println!("{}: the shrinker found the dcache busy {} times", r.label, r.shrink.busy);
        }
        if r.varied {
            println!("{}: counts differed between rounds (shown: the first round's)", r.label);
        }
    }
    let worst = |rs: &[f64], base: f64| rs.iter().fold(0.0f64, |m, &x| m.max(x / base - 1.0)) * 100.0;
    let ours: Vec<f64> = rows.iter().skip(2).map(|r| r.real.as_secs_f64()).collect();
    let seed: Vec<f64> = SEED.iter().skip(2).map(|s| s.1).collect();
    let ours_sys: Vec<f64> = rows.iter().skip(2).map(|r| r.sys.as_secs_f64()).collect();
    let seed_sys: Vec<f64> = SEED.iter().skip(2).map(|s| s.3).collect();
    let unl_sys = rows.get(1).map_or(1.0, |r| r.sys.as_secs_f64());
    let last = &rows[rows.len() - 1];
    println!(
        "slowest limited pass: ours {:+.0}% over unlimited, the seed's {:+.0}% over its root cgroup \
         (system time: ours {:+.0}%, the seed's {:+.0}%)",
        worst(&ours, unl),
        worst(&seed, SEED[1].1),
        worst(&ours_sys, unl_sys),
        worst(&seed_sys, SEED[1].3)
    );
    println!(
        "at {}: {} of {} dentries evicted by the shrinker ({} asked for in {} scans, {} rotated), {} looked up again, {} hits",
        last.label,
        last.shrink.freed,
        last.walk.created,
        last.shrink.asked,
        last.shrink.scans,
        last.shrink.rotated,
        last.walk.relookups,
        last.walk.hits
    );
    if let Some(half) = rows.get(2).filter(|r| r.events_max > 0) {
        let fits = half.max / PAGE_SIZE * ((PAGE_SIZE - 64) / size_of::<Dentry>());
        let per_hit = half.shrink.freed / half.events_max;
        println!(
            "at {}: each of the {} charges that hit max had reclaim evict {} dentries on average, {:.0}% of the {} the \
             limit holds",
            half.label,
            half.events_max,
            per_hit,
            per_hit as f64 * 100.0 / fits.max(1) as f64,
            fits
        );
    }
    let unreadable: usize = rows.iter().map(|r| r.walk.unreadable).sum();
    let failed: usize = rows.iter().map(|r| r.walk.failed).sum();
    println!("failed allocations in all passes: {failed}; unreadable entries skipped: {unreadable}");
}
