//! The sibling-name index: which group, if any, has a given name under a
//! given parent, in expected constant time, so that creating the 10,000th
//! child of a group does not compare its name with 9,999 siblings (a walk
//! that touched one group page per sibling, and made creating 10,000
//! groups take seconds).
//!
//! An open-addressing hash table of group addresses with linear probing,
//! keyed by the parent's address and the name, in one run of pages taken
//! straight from the page source (uncharged), doubled when three quarters
//! full and given back when the last group goes. Only ever touched under
//! the tree lock, so plain memory: no lookup runs without the lock.
//!
//! A removal leaves no tombstone: the entries after it in its probe run
//! move back over the hole (Knuth's Algorithm R), so every lookup ends at
//! an empty entry however many groups came and went. (With tombstones,
//! which only a rebuild cleared, a page source that ran dry left creations
//! and removals of groups filling the table with them, until a lookup
//! found no empty entry and spun forever under the tree lock.)

use core::ptr::{self, NonNull};

use lock_api::RawMutex;

use super::Group;
use crate::error::Name;
use crate::platform::{PAGE_SIZE, PageSource};

/// One entry: the key's hash (kept, so probing compares it before it
/// touches a group, and a rebuild or a removal reads no group), and null
/// (empty) or a group (with its provenance).
#[derive(Clone, Copy)]
struct Entry {
    hash: usize,
    group: *const (),
}

/// Entries of the smallest table: one page.
const MIN_CAP: usize = PAGE_SIZE / size_of::<Entry>();

/// The index (see the module docs). Lives in the tree lock's data.
pub(crate) struct Names {
    /// `cap` entries.
    table: *mut Entry,
    /// Entries (a power of two), 0 before the first group.
    cap: usize,
    /// Entries holding a group: below `cap`, so some entry is empty and
    /// every probe ends.
    live: usize,
}

/// FNV-1a over the parent's address and the name.
fn hash(parent: *const (), name: &Name) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in (parent.addr() as u64).to_le_bytes().iter().chain(name.as_str().as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // The high bits are the better mixed.
    (h ^ (h >> 32)) as usize
}

/// The page order of a table of `cap` entries.
fn order_of(cap: usize) -> u32 {
    (cap * size_of::<Entry>() / PAGE_SIZE).trailing_zeros()
}

impl Names {
    pub(super) const fn new() -> Self {
        Names { table: ptr::null_mut(), cap: 0, live: 0 }
    }

    /// Entry `i` of the table.
    ///
    /// # Safety
    ///
    /// `i < self.cap`.
    unsafe fn at(&self, i: usize) -> *mut Entry {
        // SAFETY: within the table's `cap` entries (caller).
        unsafe { self.table.add(i) }
    }

    /// Where the child of `parent` named `name` is indexed (`Ok`), or the
    /// empty entry that ends its probe sequence (`Err`).
    ///
    /// # Safety
    ///
    /// Every group indexed is live; `self.cap > 0`.
    unsafe fn probe<R: RawMutex>(&self, parent: &Group<R>, name: &Name) -> Result<usize, usize> {
        let h = hash(ptr::from_ref(parent).cast(), name);
        let mut i = h & (self.cap - 1);
        loop {
            // SAFETY: `i` is reduced modulo `cap`.
            let e = unsafe { *self.at(i) };
            match e.group.addr() {
                0 => return Err(i),
                _ if e.hash == h => {
                    // SAFETY: an indexed group, live (caller).
                    let g = unsafe { &*e.group.cast::<Group<R>>() };
                    if g.name == *name && g.parent().is_some_and(|p| ptr::eq(p, parent)) {
                        return Ok(i);
                    }
                }
                _ => {}
            }
            i = (i + 1) & (self.cap - 1);
        }
    }

    /// Whether a child of `parent` named `name` is indexed.
    ///
    /// # Safety
    ///
    /// Every group indexed is live (groups are taken out with
    /// [`Names::remove`] before they are freed).
    pub(super) unsafe fn contains<R: RawMutex>(&self, parent: &Group<R>, name: &Name) -> bool {
        // SAFETY: forwarded.
        self.cap != 0 && unsafe { self.probe(parent, name) }.is_ok()
    }

    /// Indexes `g`, a child of its parent not indexed yet. `false` when
    /// the table is full and a larger one cannot be had: the caller fails
    /// the creation with `OutOfMemory`.
    ///
    /// # Safety
    ///
    /// As for [`Names::contains`]; `g` is live; the table came from `src`.
    pub(super) unsafe fn insert<R: RawMutex, S: PageSource>(&mut self, src: &S, g: &Group<R>) -> bool {
        let Some(parent) = g.parent() else { return false };
        // SAFETY: forwarded. Short of pages, the table takes entries
        // while one stays empty.
        if (self.live + 1) * 4 > self.cap * 3 && !unsafe { self.rebuild(src) } && self.live + 1 >= self.cap {
            return false;
        }
        // SAFETY: forwarded; `cap > 0` after a rebuild or a non-empty table.
        let Err(i) = (unsafe { self.probe(parent, &g.name) }) else { return true };
        // SAFETY: entry `i` of the table, empty.
        let e = unsafe { &mut *self.at(i) };
        *e = Entry { hash: hash(ptr::from_ref(parent).cast(), &g.name), group: ptr::from_ref(g).cast() };
        self.live += 1;
        true
    }

    /// Takes `g` out of the index, if it is in it; gives the table back
    /// to `src` when it was the last group.
    ///
    /// # Safety
    ///
    /// As for [`Names::contains`]; `g` is live; the table came from `src`.
    pub(super) unsafe fn remove<R: RawMutex, S: PageSource>(&mut self, src: &S, g: &Group<R>) {
        let Some(parent) = g.parent() else { return };
        if self.cap == 0 {
            return;
        }
        // SAFETY: forwarded.
        let Ok(i) = (unsafe { self.probe(parent, &g.name) }) else { return };
        // SAFETY: entry `i` of the table.
        if unsafe { (*self.at(i)).group }.addr() != ptr::from_ref(g).addr() {
            return;
        }
        // SAFETY: `i` is an entry of the table.
        unsafe { self.close_hole(i) };
        self.live -= 1;
        if self.live == 0 {
            // SAFETY: the table came from `src` (caller), and with no
            // group indexed nothing refers to it.
            unsafe { src.free_pages(NonNull::new_unchecked(self.table.cast()), order_of(self.cap)) };
            *self = Names::new();
        }
    }

    /// Empties entry `hole` and moves back over it the entries after it
    /// in its run that may not stay where they are: each entry must be
    /// reachable from its home entry (its hash modulo `cap`) without
    /// passing an empty one (Knuth's Algorithm R).
    ///
    /// # Safety
    ///
    /// `hole < self.cap`; some entry is empty once `hole` is.
    unsafe fn close_hole(&mut self, mut hole: usize) {
        let mask = self.cap - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            // SAFETY: reduced modulo `cap`.
            let e = unsafe { *self.at(j) };
            if e.group.is_null() {
                break;
            }
            let home = e.hash & mask;
            // The entry stays if its home lies cyclically in (hole, j].
            let stays = if hole <= j { hole < home && home <= j } else { hole < home || home <= j };
            if !stays {
                // SAFETY: both reduced modulo `cap`.
                unsafe { *self.at(hole) = e };
                hole = j;
            }
        }
        // SAFETY: reduced modulo `cap`.
        unsafe { *self.at(hole) = Entry { hash: 0, group: ptr::null() } };
    }

    /// Moves the entries to a fresh table twice as large; `false`,
    /// keeping the old table, if the pages cannot be had.
    ///
    /// # Safety
    ///
    /// The table came from `src`.
    unsafe fn rebuild<S: PageSource>(&mut self, src: &S) -> bool {
        let cap = if self.cap == 0 { MIN_CAP } else { self.cap * 2 };
        let Some(run) = src.alloc_pages(order_of(cap), 0) else { return false };
        let table = run.addr.as_ptr().cast::<Entry>();
        // SAFETY: a fresh run of `cap` entries, ours, aligned for them;
        // all-zero bytes are empty entries.
        unsafe { table.write_bytes(0, cap) };
        for i in 0..self.cap {
            // SAFETY: `i < self.cap`.
            let e = unsafe { *self.at(i) };
            if !e.group.is_null() {
                let mut j = e.hash & (cap - 1);
                // SAFETY: `j` is reduced modulo the new `cap`, which has
                // room for every live entry.
                unsafe {
                    while !(*table.add(j)).group.is_null() {
                        j = (j + 1) & (cap - 1);
                    }
                    *table.add(j) = e;
                }
            }
        }
        if self.cap != 0 {
            // SAFETY: the old table came from `src`, and is copied out.
            unsafe { src.free_pages(NonNull::new_unchecked(self.table.cast()), order_of(self.cap)) };
        }
        *self = Names { table, cap, live: self.live };
        true
    }
}

// SAFETY: the table is owned memory, reached only under the tree lock.
unsafe impl Send for Names {}
