//! The slab layer's invariant check (tests and `paranoid` builds).

use core::ptr;

use lock_api::RawMutex;

use super::node::{ListKind, free_map};
use super::{Cache, SLAB_MAGIC};
use crate::platform::PAGE_SIZE;

impl<R: RawMutex> Cache<R> {
    /// Walks every list and slab and checks the accounting equations;
    /// panics on the first violation (tests).
    pub(crate) fn check(&self) {
        for (n, node) in self.nodes.iter().enumerate() {
            let lists = node.lock();
            let mut active = 0;
            for (kind, list) in
                [(ListKind::Partial, &lists.partial), (ListKind::Full, &lists.full), (ListKind::Empty, &lists.empty)]
            {
                let mut len = 0;
                let mut prev = ptr::null_mut();
                let mut s = list.head;
                while !s.is_null() {
                    // SAFETY: listed slabs are live headers under our lock.
                    let slab = unsafe { &*s };
                    assert_eq!(slab.magic, SLAB_MAGIC);
                    assert_eq!(slab.cache, self.id());
                    assert_eq!(slab.node as usize, n);
                    assert_eq!(slab.list, kind);
                    assert_eq!(slab.prev, prev);
                    assert_eq!(s as usize % (PAGE_SIZE << self.geo().order), 0);
                    let map = free_map(s);
                    let mut free = 0;
                    for w in 0..self.geo().words() {
                        // SAFETY: the free bitmap of a live slab, under our lock.
                        let bits = unsafe { map.add(w).read() };
                        let valid = if self.geo().capacity - w * 64 >= 64 {
                            u64::MAX
                        } else {
                            (1u64 << (self.geo().capacity - w * 64)) - 1
                        };
                        assert_eq!(bits & !valid, 0, "free bit beyond the slab's capacity");
                        assert!(w >= slab.hint as usize || bits == 0, "free bit below the hint");
                        free += bits.count_ones() as usize;
                    }
                    let inuse = slab.inuse as usize;
                    assert_eq!(inuse + free, self.geo().capacity);
                    match kind {
                        ListKind::Full => assert_eq!(inuse, self.geo().capacity),
                        ListKind::Empty => assert_eq!(inuse, 0),
                        ListKind::Partial => assert!(inuse < self.geo().capacity),
                    }
                    active += inuse;
                    len += 1;
                    prev = s;
                    s = slab.next;
                }
                assert_eq!(len, list.len);
            }
            assert_eq!(active, lists.active, "active objects drifted on node {n}");
        }
    }
}
