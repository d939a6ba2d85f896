//! The buddy allocator's invariant check (tests).

use super::{Buddy, FREE, ORDERS};
use crate::platform::PAGE_SIZE;

impl<const Z: usize, const N: usize> Buddy<Z, N> {
    /// Walks every list and meta array and checks the invariants; panics
    /// with a description on the first violation (tests and `paranoid`).
    pub(crate) fn check(&self) {
        let mut listed = 0usize;
        for (node, order) in (0..N).flat_map(|n| (0..ORDERS).map(move |o| (n, o))) {
            let mut prev = core::ptr::null_mut();
            let mut cur = self.heads[node][order];
            while !cur.is_null() {
                assert_eq!(cur.addr() % (PAGE_SIZE << order), 0, "misaligned free block");
                let zi = self.zone_of(cur.addr()).expect("free block outside zones");
                assert_eq!(usize::from(self.zones[zi].node), node, "free block on another node's list");
                // SAFETY: `cur` is in zone `zi`.
                assert_eq!(unsafe { *self.meta(zi, cur.addr()) }, FREE | order as u8);
                // SAFETY: `cur` is on a free list, so it holds links.
                let b = unsafe { cur.read() };
                assert_eq!(b.prev, prev, "broken back link");
                listed += 1 << order;
                prev = cur;
                cur = b.next;
            }
        }
        assert_eq!(listed, self.free_pages, "free page count drifted");
        for order in 0..ORDERS {
            let mut n = 0;
            for heads in &self.heads {
                let mut cur = heads[order];
                while !cur.is_null() {
                    n += 1;
                    // SAFETY: `cur` is on a free list, so it holds links.
                    cur = unsafe { cur.read() }.next;
                }
            }
            assert_eq!(n, self.counts[order], "block count of order {order} drifted");
        }
        let mut heads = 0usize;
        for zi in 0..self.nzones {
            let z = &self.zones[zi];
            for p in 0..z.pages {
                // SAFETY: p < z.pages, the meta length.
                let m = unsafe { *self.meta_at(z, p) };
                if m & FREE != 0 {
                    heads += 1 << (m & !FREE);
                }
            }
        }
        assert_eq!(heads, self.free_pages, "meta bytes and lists disagree");
    }
}
