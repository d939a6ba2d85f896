//! Shrinkers: the registered list, what a shrinker is told
//! ([`ShrinkControl`], [`GroupId`]), and a reclaim round's calls to them,
//! asking each for a share of what it holds.

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::super::Tree;
use super::super::protection::{Pass, Take, Visit};
use crate::cgroup::{Group, MEMALLOC, RECLAIMING, TokenHead};
use crate::counter::PageCounter;
use crate::error::Error;
use crate::magazine::Env;
use crate::platform::{PAGE_SIZE, PageSource, Platform};

/// Shrinkers a reclaim copies out of the list per hold of its lock.
const SHRINKER_CHUNK: usize = 8;

/// The registered shrinkers: a table in pages taken straight from the page
/// source (uncharged), doubled when full and kept for the allocator's
/// life; unregistering leaves a hole that the next registration takes.
/// Only touched under the tree's `shrinkers` lock.
pub(crate) struct Shrinkers {
    /// `cap` entries, the first `len` in use (holes are `None`).
    table: *mut Option<&'static dyn Shrinker>,
    cap: usize,
    len: usize,
}

// SAFETY: the table is owned memory, reached only under the lock.
unsafe impl Send for Shrinkers {}

impl Shrinkers {
    pub(in crate::cgroup::tree) const fn new() -> Self {
        Shrinkers { table: core::ptr::null_mut(), cap: 0, len: 0 }
    }

    /// The entries in use.
    fn entries(&mut self) -> &mut [Option<&'static dyn Shrinker>] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `table` holds `cap >= len` initialised entries, ours
        // while the lock is held.
        unsafe { core::slice::from_raw_parts_mut(self.table, self.len) }
    }

    /// Up to [`SHRINKER_CHUNK`] entries from index `from`, and the number
    /// of entries in use.
    fn chunk(&mut self, from: usize) -> ([Option<&'static dyn Shrinker>; SHRINKER_CHUNK], usize) {
        let mut out = [None; SHRINKER_CHUNK];
        let e = self.entries();
        if let Some(src) = e.get(from..) {
            let n = src.len().min(SHRINKER_CHUNK);
            out[..n].copy_from_slice(&src[..n]);
        }
        (out, e.len())
    }

    /// Adds `s` (once); `OutOfMemory` when the table is full and a larger
    /// one cannot be had.
    fn add<S: PageSource>(&mut self, src: &S, s: &'static dyn Shrinker) -> Result<(), Error> {
        if self.entries().iter().flatten().any(|x| core::ptr::addr_eq(*x, s)) {
            return Ok(());
        }
        if let Some(hole) = self.entries().iter_mut().find(|x| x.is_none()) {
            *hole = Some(s);
            return Ok(());
        }
        if self.len == self.cap {
            const ENTRY: usize = size_of::<Option<&'static dyn Shrinker>>();
            let cap = if self.cap == 0 { PAGE_SIZE / ENTRY } else { self.cap * 2 };
            let order = (cap * ENTRY / PAGE_SIZE).trailing_zeros();
            let run = src.alloc_pages(order, 0).ok_or(Error::OutOfMemory)?;
            let table = run.addr.as_ptr().cast::<Option<&'static dyn Shrinker>>();
            for i in 0..cap {
                // SAFETY: a fresh run of `cap` entries, ours, aligned for
                // them; entries below `len` copied from the old table.
                unsafe { table.add(i).write(if i < self.len { *self.table.add(i) } else { None }) };
            }
            if self.cap != 0 {
                let old = (self.cap * ENTRY / PAGE_SIZE).trailing_zeros();
                // SAFETY: the old table came from `src`, and is copied out.
                unsafe { src.free_pages(NonNull::new_unchecked(self.table.cast()), old) };
            }
            self.table = table;
            self.cap = cap;
        }
        // SAFETY: `len < cap`: an initialised entry of the table.
        unsafe { *self.table.add(self.len) = Some(s) };
        self.len += 1;
        Ok(())
    }

    /// Takes `s` out, leaving a hole.
    fn remove(&mut self, s: &'static dyn Shrinker) {
        for x in self.entries() {
            if x.is_some_and(|y| core::ptr::addr_eq(y, s)) {
                *x = None;
            }
        }
    }
}

/// A group's identity for shrinkers: stable while the group has charged
/// objects. It holds the address of the group's token head (null for the
/// root) and is only compared, or followed up the tree by
/// [`ShrinkControl::contains`] once that has found the group among the
/// allocator's live groups: any id, even one of a group long freed (whose
/// address a new group may have taken since), is safe to pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupId(pub(crate) *const (), u32);

impl GroupId {
    /// The root group.
    pub const ROOT: GroupId = GroupId(core::ptr::null(), u32::MAX);
}

/// What a shrinker is asked to shrink: objects on `node` charged to
/// `target` or to any of its descendants, or, when reclaim visits a
/// subtree with protected groups in it one group at a time
/// ([`ShrinkControl::own_only`]), to `target` alone. A shrinker finds
/// what is in scope with [`ShrinkControl::contains`].
pub struct ShrinkControl {
    target: GroupId,
    node: usize,
    own: bool,
    /// The `Tree<R>` whose shrinkers run, erased (shrinkers are not
    /// generic over the lock type), for `known`.
    tree: *const (),
    /// `Tree::<R>::knows` of that tree.
    known: unsafe fn(*const (), GroupId) -> bool,
}

impl ShrinkControl {
    /// The group being reclaimed.
    pub fn target(&self) -> GroupId {
        self.target
    }

    /// The node being reclaimed.
    pub fn node(&self) -> usize {
        self.node
    }

    /// Whether only objects of the target itself are in scope (and those
    /// of its removed descendants, which it inherits), not those of its
    /// live descendants: some of them are protected, and reclaim visits
    /// them on their own.
    pub fn own_only(&self) -> bool {
        self.own
    }

    /// Whether objects charged to `g` are in scope: `g` is the target or
    /// one of its descendants; with [`ShrinkControl::own_only`], `g` is the
    /// target or a removed group whose nearest live ancestor is the
    /// target. Any id may be passed: one that names no group of this
    /// allocator (freed since, or of another allocator) is out of scope,
    /// unless the target is the root and scope is not `own_only`, where
    /// every id is in. The target itself costs one comparison; another id
    /// a walk of the allocator's groups (to find it among them) and then
    /// of its ancestors.
    pub fn contains(&self, g: GroupId) -> bool {
        if g == self.target {
            return true;
        }
        if !self.own && self.target == GroupId::ROOT {
            return true;
        }
        // SAFETY: `tree` and `known` were set together from one live tree,
        // whose shrinker call this is (a `ShrinkControl` lives only as
        // long as that call, which holds a read guard of the tree).
        if !unsafe { (self.known)(self.tree, g) } {
            return false;
        }
        // From here on `g` names a group still linked in the tree, and the
        // read guard of this shrinker call keeps it (and its ancestors,
        // which its references keep linked) from being freed.
        if self.own {
            return self.owns(g);
        }
        let mut cur = g.0.cast::<TokenHead>();
        while !cur.is_null() {
            if core::ptr::eq(cur.cast(), self.target.0) {
                return true;
            }
            // `g` is linked in the tree (checked above), so live while
            // this shrinker call's read guard lasts, and a live group's
            // ancestors are live; every group's head names its parent's
            // head, whatever the lock type.
            // SAFETY: `cur` is the head of a live group (see above).
            cur = unsafe { (*cur).parent };
        }
        false
    }

    /// [`ShrinkControl::contains`] with [`ShrinkControl::own_only`], for a
    /// `g` found linked in the tree (or the root's null id).
    fn owns(&self, g: GroupId) -> bool {
        let mut cur = g.0.cast::<TokenHead>();
        loop {
            // `g` is live (found linked by `contains`, kept by the call's
            // read guard), and so are its ancestors; every group's head
            // names its parent's head and holds its state, whatever the
            // lock type.
            // SAFETY: a non-null `cur` is the head of a live group.
            if cur.is_null() || !unsafe { (*cur).is_offline() } {
                break;
            }
            // SAFETY: as above.
            cur = unsafe { (*cur).parent };
        }
        if self.target == GroupId::ROOT {
            // The root's head is the one without a parent (its id is null).
            // SAFETY: as above.
            cur.is_null() || unsafe { (*cur).parent.is_null() }
        } else {
            core::ptr::eq(cur.cast(), self.target.0)
        }
    }
}

/// How far a reclaim with a goal has come: shrinkers are asked for about
/// what the rest of it needs, at the pages per object seen so far.
pub(super) struct Goal<'a> {
    pub(super) counter: &'a PageCounter,
    /// The counter's usage when the reclaim started.
    pub(super) start: usize,
    /// Pages wanted.
    pub(super) want: usize,
    /// Objects the shrinkers freed so far.
    pub(super) objects: usize,
    /// Whether the shrinkers' requests are bounded by the goal (every
    /// round but the last).
    pub(super) bounded: bool,
}

impl Goal<'_> {
    /// Pages the counter lost since the start.
    pub(super) fn freed(&self) -> usize {
        self.start.saturating_sub(self.counter.usage())
    }

    pub(super) fn met(&self) -> bool {
        self.freed() >= self.want
    }

    /// The most objects to ask a shrinker for: none once the goal is met,
    /// else the rest of the goal at the pages per object freed so far (no
    /// bound before anything was, or in the last round).
    pub(super) fn bound(&self) -> usize {
        let freed = self.freed();
        if freed >= self.want {
            return 0;
        }
        if !self.bounded || self.objects == 0 || freed == 0 {
            return usize::MAX;
        }
        let rest = (self.want - freed) as u128;
        usize::try_from((rest * self.objects as u128).div_ceil(freed as u128)).unwrap_or(usize::MAX)
    }
}

/// How many of the `n` objects in scope to ask a shrinker for at `share`:
/// `n / share + 1`, but no more than the group's objects above the
/// protection `floor` honoured there (its usage `u` above `floor`, in
/// proportion, as if its objects were of one size; Linux scales its scan
/// the same way), nor than `bound`.
fn ask(n: usize, share: usize, u: usize, floor: usize, bound: usize) -> usize {
    let mut nr = (n / share).saturating_add(1);
    if floor > 0 && u > 0 {
        let over = u.saturating_sub(floor) as u128;
        let fair = usize::try_from((n as u128 * over).div_ceil(u as u128)).unwrap_or(usize::MAX);
        nr = nr.min(fair.max(1));
    }
    nr.min(bound)
}

/// A cache of objects that can be freed on demand (Linux's group- and
/// node-aware shrinkers): a dentry LRU, a connection pool.
///
/// Shrinkers are called with no allocator lock held, from whatever thread
/// is reclaiming; they may free objects (which is the point).
///
/// **Allocating.** A shrinker had better not allocate, but may (a list of
/// victims, say): its allocations never reclaim (reclaim does not re-enter
/// itself), and one that a group's `max` refuses is charged past it, by at
/// most [`RECLAIM_OVERDRAFT`](crate::RECLAIM_OVERDRAFT) pages per group, and counted in the group's
/// [`GroupStat::overdrafts`](crate::GroupStat::overdrafts) (Linux's
/// `PF_MEMALLOC`), so a program does not abort for a failed allocation in
/// its shrinker. The limit holds on the way back: the allocation that
/// started the reclaim charges within `max` or fails, and the group's next
/// reclaim takes back what was overdrawn. Beyond the overdraft, or with
/// the page source exhausted, its allocations fail.
///
/// **The current group.** A shrinker leaves its thread's current group as
/// it found it: a group it enters, or a reset to the root, is undone when
/// it returns, and the group current before stays alive while it runs
/// (the allocation that reclaimed still charges it).
///
/// **Panicking.** A shrinker should not panic. If `count` or `scan`
/// panics and the panic unwinds (with `panic = abort` nothing does), the
/// reclaim that called it stops there and the panic goes on up the
/// allocation (or [`Cgroup::reclaim`](crate::Cgroup::reclaim),
/// [`Cgroup::set_max`](crate::Cgroup::set_max)) that reclaimed: the
/// thread's marks are restored, no allocator lock is held, the refused
/// charge was already taken back, and the allocation makes nothing; a
/// `catch_unwind` around it finds the allocator as before, and the
/// shrinker is called again by the next reclaim. Through `GlobalAlloc`,
/// which must not unwind, the panic aborts the program instead.
pub trait Shrinker: Sync {
    /// How many objects in scope could be freed. See the trait docs for
    /// what happens if it panics.
    fn count(&self, sc: &ShrinkControl) -> usize;
    /// Frees up to `nr` objects in scope; returns how many it freed. See
    /// the trait docs for what happens if it allocates or panics.
    fn scan(&self, sc: &ShrinkControl, nr: usize) -> usize;
}

// SAFETY: a `GroupId` is an identity: nothing dereferences it except
// `ShrinkControl::contains`, after finding it among the tree's groups
// under a read guard, and groups are shared between threads anyway.
unsafe impl Send for GroupId {}
// SAFETY: as above; it has no interior mutability.
unsafe impl Sync for GroupId {}

impl<R: RawMutex> Tree<R> {
    /// Registers a shrinker; safe while reclaim runs (a reclaim in progress
    /// uses the entries it copied). Registering one twice is a no-op.
    pub(crate) fn register_shrinker<S: PageSource>(&self, src: &S, s: &'static dyn Shrinker) -> Result<(), Error> {
        self.shrinkers.lock().add(src, s)
    }

    /// Unregisters a shrinker; a reclaim already running may still call it
    /// once (it is `'static`, so that is safe).
    pub(crate) fn unregister_shrinker(&self, s: &'static dyn Shrinker) {
        self.shrinkers.lock().remove(s);
    }

    /// The identity shrinkers see for `g`.
    pub(crate) fn group_id(&self, g: &Group<R>) -> GroupId {
        GroupId(self.token(g), g.index())
    }

    /// Whether `id` is the root's or names a group linked in `tree`'s
    /// `all_groups` (not yet reclaimed): its index in the id table still
    /// names its address, so `id` is never followed to find out.
    ///
    /// # Safety
    ///
    /// `tree` points to a live `Tree<R>`.
    pub(crate) unsafe fn knows(tree: *const (), id: GroupId) -> bool {
        if id == GroupId::ROOT {
            return true;
        }
        // SAFETY: the caller's contract.
        let tree = unsafe { &*tree.cast::<Self>() };
        tree.ids.names(id.1, id.0)
    }

    /// Calls every shrinker on every node for what a pass of a reclaim
    /// rooted at `root` may take from `target`'s subtree (see
    /// `protection`), without locks held; returns the objects they freed
    /// and the objects they held in scope. What a shrinker reports is
    /// clamped (a `scan` frees at most what it was asked for; sums
    /// saturate), so a shrinker that lies cannot make reclaim overflow or
    /// loop. While they run, the context's current group token carries
    /// the [`RECLAIMING`] and `MEMALLOC` tags: an allocation a shrinker
    /// makes charges as usual but skips reclaim, and may overdraw a `max`
    /// ([`RECLAIM_OVERDRAFT`]). A read guard keeps the groups the walk
    /// reaches from being freed meanwhile (it only defers freeing group
    /// metadata; nothing waits for it).
    pub(super) fn run_shrinkers<E: Env<R>>(
        &self,
        env: &E,
        root: &Group<R>,
        target: &Group<R>,
        pass: &mut Pass,
        share: usize,
        mut goal: Option<&mut Goal<'_>>,
    ) -> (usize, usize) {
        // The first chunk is copied once; a reclaim with more shrinkers
        // than that copies the rest a chunk at a time, per group visited.
        let (first, len) = self.shrinkers.lock().chunk(0);
        let (mut freed, mut held) = (0usize, 0usize);
        if first.iter().all(Option::is_none) && len <= SHRINKER_CHUNK {
            return (0, 0);
        }
        let platform = env.plat();
        // The tagged token names the same group with the same reference,
        // so the platform slot's reference is untouched. The guards restore
        // the context's marks and current group (see `CallbackScope`) and
        // release the read guard when the shrinkers return or one of them
        // unwinds (nothing else is held across the calls, and `freed`,
        // `held` and the goal are ours).
        let scope = self.callback_scope(platform, RECLAIMING | MEMALLOC);
        if !scope.may_run(0) {
            // A context that cannot be marked: a shrinker's allocations
            // there would reclaim and call it again.
            return (0, 0);
        }
        {
            let _read = self.read_guard();
            Self::plan(root, target, pass, |v, Visit { take, floor, .. }| {
                if take == Take::Nothing {
                    return;
                }
                let id = self.group_id(v);
                let mut chunk = first;
                let mut next = SHRINKER_CHUNK;
                loop {
                    for s in chunk.iter().flatten() {
                        for node in 0..platform.nodes().clamp(1, crate::platform::MAX_NODES) {
                            let sc = ShrinkControl {
                                target: id,
                                node,
                                own: take == Take::Own,
                                tree: core::ptr::from_ref(self).cast(),
                                known: Self::knows,
                            };
                            // A share per round (at least one), as Linux scans
                            // at a priority rather than emptying a cache at once.
                            let n = s.count(&sc);
                            held = held.saturating_add(n);
                            let bound = goal.as_deref().map_or(usize::MAX, Goal::bound);
                            let nr = ask(n, share, v.counter.usage(), floor, bound);
                            if n > 0 && nr > 0 {
                                let got = s.scan(&sc, nr).min(nr);
                                freed = freed.saturating_add(got);
                                if let Some(g) = goal.as_deref_mut() {
                                    g.objects = g.objects.saturating_add(got);
                                }
                            }
                        }
                    }
                    if next >= len {
                        break;
                    }
                    (chunk, _) = self.shrinkers.lock().chunk(next);
                    next += SHRINKER_CHUNK;
                }
            });
        }
        if freed > 0 {
            // With detection on, what the shrinkers freed waits in the
            // quarantine, charged and keeping its slabs: give it back now
            // (no lock held), so that the drains after this round free
            // those slabs and the charges drop, as `reclaim` did for what
            // was there before it began.
            env.flush_deferred();
        }
        (freed, held)
    }
}
