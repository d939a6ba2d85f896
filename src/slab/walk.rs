//! Walking the objects a cache has handed out (leak reports).

use lock_api::RawMutex;

use super::Cache;
use super::node::free_map;
use crate::sync::word_load;

impl<R: RawMutex> Cache<R> {
    /// Calls `f` with every object of this cache out of its slabs (live,
    /// or cached in a magazine or a quarantine), its owner word (0 for a
    /// cache without them, and for an object its owner freed: null) and its
    /// slab's node, one node at a time under its lock: `f` must not
    /// allocate from this cache or take its locks. For reports; never an
    /// allocation path.
    pub(crate) fn for_each_allocated(&self, mut f: impl FnMut(*mut u8, *mut (), usize)) {
        let g = *self.geo();
        for node in &self.nodes {
            let lists = node.lock();
            for list in [&lists.partial, &lists.full] {
                let mut s = list.head;
                while !s.is_null() {
                    let map = free_map(s);
                    // SAFETY: a listed slab's header, under the lock.
                    let node = unsafe { (*s).node } as usize;
                    for i in 0..g.capacity {
                        // SAFETY: the free bitmap of a listed slab (`words`
                        // words cover `capacity` bits), under its node's lock.
                        let free = unsafe { map.add(i / 64).read() } >> (i % 64) & 1 != 0;
                        if !free {
                            let owner = if g.has_owners() {
                                // SAFETY: the owner word of slot `i` of a
                                // live slab, written only through
                                // `word_store`.
                                unsafe { word_load(s.cast::<u8>().add(g.owners).cast::<*mut ()>().add(i)) }
                            } else {
                                core::ptr::null_mut()
                            };
                            f(s.cast::<u8>().wrapping_add(g.first + i * g.size), owner, node);
                        }
                    }
                    // SAFETY: a listed slab's header, under the lock.
                    s = unsafe { (*s).next };
                }
            }
        }
    }
}
