//! One node's slabs of one cache: the slab header and its free bitmap,
//! the intrusive slab lists, and the list updates done under the node's
//! lock.

use core::ptr::{self, NonNull};

use super::geometry::Geometry;
use super::{HEADER, MAP_OFFSET, PREFETCH_AHEAD, prefetch_write};

/// Which list a slab is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum ListKind {
    Partial = 1,
    Full = 2,
    Empty = 3,
}

/// The header at the start of every slab.
///
/// All fields but `magic`, `cache` and `node` (fixed at creation) are read
/// and written only under the lock of node `node` of cache `cache`.
#[repr(C)]
pub(crate) struct Slab {
    /// `SLAB_MAGIC` while the slab is live, 0 once handed back.
    pub(super) magic: u32,
    /// The node whose lists hold this slab.
    pub(super) node: u8,
    /// The list the slab is on.
    pub(super) list: ListKind,
    /// No word of the free bitmap below this one has a set bit (a slab
    /// of at most 1 MiB has at most 2^14 words).
    pub(super) hint: u16,
    /// Objects handed out and not returned.
    pub(super) inuse: u32,
    /// This slab's number in the process (`sync::next_sequence`): tells a
    /// slab from an earlier one at the same address (memory-error
    /// detection's object tags mix it in).
    pub(super) birth: u32,
    /// The cache that owns this slab.
    pub(super) cache: *const (),
    pub(super) next: *mut Slab,
    pub(super) prev: *mut Slab,
}

static_assertions::const_assert!(core::mem::size_of::<Slab>() <= HEADER);
// Eight bytes of counters and flags, then the pointers: the free bitmap
// after it still shares the header's cache line for up to 192 objects.
#[cfg(target_pointer_width = "64")]
static_assertions::const_assert_eq!(core::mem::size_of::<Slab>(), 40);

/// The free bitmap of the slab at `s`: [`Geometry::words`] words right
/// after the `Slab` struct (at [`MAP_OFFSET`]), bit `i` of word `w` set
/// while object `64 * w + i` is in the slab. Derived from `s`, outside the `Slab` struct, so it never
/// overlaps a reference to the header.
#[inline(always)]
pub(super) fn free_map(s: *mut Slab) -> *mut u64 {
    s.cast::<u8>().wrapping_add(MAP_OFFSET).cast()
}

/// The `t` lowest bits set (`t <= 63`).
#[inline(always)]
fn low_bits(t: usize) -> u64 {
    (1u64 << t) - 1
}

/// An intrusive doubly linked list of slabs.
pub(super) struct List {
    pub(super) head: *mut Slab,
    pub(super) len: usize,
}

impl List {
    const EMPTY: List = List { head: ptr::null_mut(), len: 0 };

    /// # Safety
    ///
    /// `s` is a live slab header on no list, owned by the caller's lock.
    pub(super) unsafe fn push(&mut self, s: *mut Slab, kind: ListKind) {
        // SAFETY: per the contract, `s` and the current head are live headers
        // guarded by the lock the caller holds.
        unsafe {
            (*s).prev = ptr::null_mut();
            (*s).next = self.head;
            (*s).list = kind;
            if !self.head.is_null() {
                (*self.head).prev = s;
            }
        }
        self.head = s;
        self.len += 1;
    }

    /// # Safety
    ///
    /// `s` is on this list, and the caller holds its lock.
    pub(super) unsafe fn remove(&mut self, s: *mut Slab) {
        // SAFETY: `s` and its neighbours are live headers on this list.
        unsafe {
            let (prev, next) = ((*s).prev, (*s).next);
            if prev.is_null() {
                self.head = next;
            } else {
                (*prev).next = next;
            }
            if !next.is_null() {
                (*next).prev = prev;
            }
        }
        self.len -= 1;
    }
}

/// One node's slabs of one cache.
pub(super) struct NodeSlabs {
    pub(super) partial: List,
    pub(super) full: List,
    pub(super) empty: List,
    /// Objects handed out from this node's slabs.
    pub(super) active: usize,
}

// SAFETY: the raw slab pointers refer to page runs owned by the cache; all
// access goes through the node lock that wraps this value.
unsafe impl Send for NodeSlabs {}

impl NodeSlabs {
    pub(super) const fn new() -> Self {
        NodeSlabs { partial: List::EMPTY, full: List::EMPTY, empty: List::EMPTY, active: 0 }
    }

    pub(super) fn list(&mut self, kind: ListKind) -> &mut List {
        match kind {
            ListKind::Partial => &mut self.partial,
            ListKind::Full => &mut self.full,
            ListKind::Empty => &mut self.empty,
        }
    }

    /// Moves `s` from its list to `to`.
    ///
    /// # Safety
    ///
    /// `s` is a live slab on one of these lists.
    pub(super) unsafe fn relist(&mut self, s: *mut Slab, to: ListKind) {
        // SAFETY: forwarded.
        unsafe {
            let from = (*s).list;
            self.list(from).remove(s);
            self.list(to).push(s, to);
        }
    }

    /// Hands out one object from a partial (or else empty) slab.
    ///
    /// # Safety
    ///
    /// All listed slabs belong to a cache with geometry `g`.
    #[inline]
    pub(super) unsafe fn take(&mut self, g: &Geometry) -> Option<NonNull<u8>> {
        let mut out = [ptr::null_mut(); 1];
        // SAFETY: forwarded.
        match unsafe { self.take_bulk(g, &mut out) } {
            // SAFETY: slab objects are never null.
            1 => Some(unsafe { NonNull::new_unchecked(out[0]) }),
            _ => None,
        }
    }

    /// Fills `out` with objects from partial (or else empty) slabs, as
    /// many from each slab as it has, with one header update and at most
    /// one list move per slab. Returns how many it took: fewer than asked
    /// only when the node has no free object left.
    ///
    /// # Safety
    ///
    /// All listed slabs belong to a cache with geometry `g`.
    pub(super) unsafe fn take_bulk(&mut self, g: &Geometry, out: &mut [*mut u8]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let mut s = self.partial.head;
            if s.is_null() {
                s = self.empty.head;
                if s.is_null() {
                    break;
                }
                // SAFETY: `s` heads the empty list.
                unsafe { self.relist(s, ListKind::Partial) };
            }
            // SAFETY: `s` is a live slab of this node with a free object (it
            // is partial or empty); its header is guarded by our lock.
            unsafe {
                let want = (out.len() - n).min(g.capacity - (*s).inuse as usize);
                let map = free_map(s);
                let mut w = (*s).hint as usize;
                let mut got = 0;
                // `want` is at most the free bits, all at or after `hint`;
                // `w < words` only guards the bitmap's end.
                while got < want && w < g.words() {
                    let mut bits = *map.add(w);
                    while bits != 0 && got < want {
                        // A run of free slots, from the lowest free bit:
                        // its objects are `size` apart, one add each (a
                        // fresh slab's words are whole runs).
                        let low = bits.trailing_zeros() as usize;
                        let take = ((!(bits >> low)).trailing_zeros() as usize).min(want - got);
                        let mut p = (s as *mut u8).add(g.first + (w * 64 + low) * g.size);
                        for slot in &mut out[n + got..n + got + take] {
                            *slot = p;
                            p = p.wrapping_add(g.size);
                        }
                        // `1 <= take <= 64 - low`.
                        bits &= !((u64::MAX >> (64 - take)) << low);
                        got += take;
                    }
                    *map.add(w) = bits;
                    if bits == 0 {
                        w += 1;
                    }
                }
                (*s).hint = w as u16;
                (*s).inuse += got as u32;
                if (*s).inuse as usize == g.capacity {
                    self.relist(s, ListKind::Full);
                }
                self.active += got;
                n += got;
                if got < want {
                    // Fewer free bits than `inuse` promised: only a broken
                    // invariant gets here; stop rather than spin.
                    debug_assert!(false, "slab free bitmap disagrees with its count");
                    break;
                }
            }
        }
        n
    }

    /// Returns `obj` to slab `s`; yields a slab to give back to the page
    /// source when more than `reserve` are empty.
    ///
    /// # Safety
    ///
    /// `obj` is a live object of `s`, a slab of this node with geometry `g`.
    #[inline]
    pub(super) unsafe fn put(&mut self, s: *mut Slab, obj: *mut u8, g: &Geometry, reserve: usize) -> Option<*mut Slab> {
        // SAFETY: forwarded.
        unsafe { self.put_run(s, &[obj], g, reserve) }.1
    }

    /// Returns the objects at the front of `objs` that lie in slab `s`
    /// (the first does; the run ends at the first that does not), each
    /// marked free in its bitmap, with one header update and at most one
    /// list move. Yields how many it took, and the slab to give back to
    /// the page source when it empties and more than `reserve` slabs are
    /// empty. As it walks, it starts the miss of the header of the object
    /// [`PREFETCH_AHEAD`] places on, which a later run will update (the
    /// headers of objects freed long after they were used miss the
    /// cache).
    ///
    /// Objects next to each other in `objs` and in the slab, going up or
    /// down (a magazine of objects freed in the order they were
    /// allocated: a refill hands a slab's objects out from the top down),
    /// are taken a bitmap word at a time: their bits gather in a
    /// register, with one address compare each, and go into the word
    /// with one double-free test for them all. Any other object takes the
    /// division and the slot test of its own.
    ///
    /// # Safety
    ///
    /// `objs` are distinct live objects of slabs with geometry `g` (of
    /// any node; only their addresses are read beyond the run), and
    /// `objs[0]` is one of `s`, a slab of this node.
    pub(super) unsafe fn put_run(
        &mut self,
        s: *mut Slab,
        objs: &[*mut u8],
        g: &Geometry,
        reserve: usize,
    ) -> (usize, Option<*mut Slab>) {
        // SAFETY: per the contract: `s` is a live slab header of this node,
        // whose list lock we hold, so it is ours to update; the objects
        // are only located in its bitmap, never touched.
        unsafe {
            let map = free_map(s);
            let mut back = 0u32;
            // The lowest word that gains a free bit, kept in a register:
            // the header is written once, after the loop (the bitmap
            // stores in it could otherwise alias the header for the
            // compiler, which then reloads and stores the hint per object).
            let mut hint = usize::from((*s).hint);
            let first = s.addr() + g.first;
            // Object slots end here (from `first`): an offset past it, or
            // before `first` (wrapped), is no slot.
            let span = g.capacity * g.size;
            let mut k = 0;
            while let Some(&obj) = objs.get(k) {
                if obj.addr() & g.slab_mask != s.addr() {
                    break;
                }
                k += 1;
                if let Some(&ahead) = objs.get(k + PREFETCH_AHEAD - 1) {
                    prefetch_write(ahead.map_addr(|a| a & g.slab_mask));
                }
                let off = obj.addr().wrapping_sub(first);
                let i = match g.index_of(off) {
                    Some(i) if off < span => i,
                    // Not an object slot of this slab: a contract breach
                    // the layers above catch in hardened mode; leave the
                    // slab as it is.
                    _ => continue,
                };
                let k0 = k - 1;
                let w = i / 64;
                let mut bits = 1u64 << (i % 64);
                // The neighbours that follow `obj` in `objs`, in one
                // direction, as far as the word's slots go (below
                // `capacity`, so each is a slot of this slab).
                let lo = w * 64;
                let hi = (lo + 64).min(g.capacity);
                let next = objs.get(k).map_or(0, |p| p.addr());
                if next == obj.addr().wrapping_add(g.size) {
                    let n = (hi - 1 - i).min(objs.len() - k);
                    let mut at = next;
                    let mut t = 0;
                    while t < n && objs.get_unchecked(k + t).addr() == at {
                        t += 1;
                        at = at.wrapping_add(g.size);
                    }
                    // Bits `i % 64 + 1 ..= i % 64 + t` (none for `t == 0`,
                    // whose shift may be 64).
                    bits |= low_bits(t).wrapping_shl((i % 64 + 1) as u32);
                    k += t;
                } else if next == obj.addr().wrapping_sub(g.size) {
                    let n = (i - lo).min(objs.len() - k);
                    let mut at = next;
                    let mut t = 0;
                    while t < n && objs.get_unchecked(k + t).addr() == at {
                        t += 1;
                        at = at.wrapping_sub(g.size);
                    }
                    // Bits `i % 64 - t .. i % 64`.
                    bits |= low_bits(t) << (i % 64 - t);
                    k += t;
                }
                let word = map.add(w);
                let old = *word;
                // `obj` and its `t` neighbours.
                let mut freed = (k - k0) as u32;
                if old & bits != 0 {
                    // Already free: a double free. Refusing it keeps the
                    // slab's count and bitmap right.
                    crate::platform::hardened_abort("kmemcg: double free");
                    bits &= !old;
                    freed = bits.count_ones();
                    if bits == 0 {
                        continue;
                    }
                }
                *word = old | bits;
                hint = hint.min(w);
                back += freed;
            }
            if back == 0 {
                return (k, None);
            }
            // A word index of this slab: below 2^14 (see `Slab::hint`).
            (*s).hint = hint as u16;
            let was_full = (*s).inuse as usize == g.capacity;
            (*s).inuse -= back;
            self.active -= back as usize;
            if (*s).inuse == 0 {
                self.relist(s, ListKind::Empty);
                if self.empty.len > reserve {
                    self.empty.remove(s);
                    return (k, Some(s));
                }
            } else if was_full {
                self.relist(s, ListKind::Partial);
            }
            (k, None)
        }
    }
}
