//! Invariant checks for tests and the `paranoid` feature: every list,
//! bitmap and counter walked and compared with the accounting equations.

#![cfg(any(test, feature = "paranoid"))]

use lock_api::RawMutex;

use super::Kmem;
use crate::cgroup::Group;
use crate::platform::{MAX_NODES, PAGE_SIZE, PageSource, Platform};
#[cfg(test)]
use crate::slab::{Cache, classes::class_of};

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// The cache serving `size`/`align` requests, for tests and reports.
    #[cfg(test)]
    pub(crate) fn class_cache(&self, size: usize, align: usize) -> Option<&Cache<R>> {
        class_of(size, align).map(|c| &self.tree().classes()[c].cache)
    }

    /// Checks every cache's lists and accounting (tests, `paranoid`).
    #[cfg(any(test, feature = "paranoid"))]
    pub(crate) fn check(&self) {
        self.tree().for_each_cache(&mut |c| c.cache.check());
        self.tree().descriptors.check();
        self.tree().pressure_nodes.check();
    }

    /// Walks every slab list, free bitmap and counter and checks the
    /// invariants, panicking on the first violation: each cache's
    /// `inuse + free == capacity` per slab and `active` per
    /// node; then, after emptying magazines and stocks (so it changes what
    /// is cached, never what is live), every group's usage equals the pages
    /// of the slabs it owns plus its large objects plus its children's
    /// usage, its slabs and large objects are on nodes as noted, and
    /// nothing has wrapped. For fuzzing and tests (feature
    /// `paranoid`); it takes locks and drains, so never call it from an
    /// allocation path.
    #[cfg(feature = "paranoid")]
    #[cfg_attr(docsrs, doc(cfg(feature = "paranoid")))]
    pub fn check_invariants(&self) {
        self.check();
        self.check_accounting();
    }

    /// The accounting equations, checked after draining magazines and
    /// stocks; see [`Kmem::check_invariants`].
    #[cfg(any(test, feature = "paranoid"))]
    pub(crate) fn check_accounting(&self) {
        self.shrink();
        let t = self.tree();
        // The root's own: the slabs of its caches (charged caches included).
        let mut root_own = 0;
        t.root_caches(&mut |c| root_own += c.cache.stats().pages);
        // Object pages of each group's subtree: they stop below the root.
        // Over every group whose parents lead to `g`, not a walk of the
        // child lists: a removed group leaves its parent's list but stays,
        // charged, while its objects live (a walk missed a removed
        // grandchild's pages: review finding).
        let obj_subtree = |g: &Group<R>| {
            let mut n = 0;
            t.for_each_group(|x| {
                let mut up = Some(x);
                while let Some(y) = up {
                    if core::ptr::eq(y, g) {
                        n += t.obj_pages(x);
                        break;
                    }
                    up = y.parent();
                }
            });
            n
        };
        // Large pages charged to the root itself: all minus the groups'.
        let mut in_groups = 0;
        t.for_each_group(|x| in_groups += x.large_pages().get());
        let root_large = self.stats().large_pages - in_groups;
        t.for_each_group_and_root(|g| {
            let root = t.is_root(g);
            let mut children = 0;
            t.for_each_group(|x| {
                if x.parent().is_some_and(|p| core::ptr::eq(p, g)) {
                    children += x.counter().usage() - if root { obj_subtree(x) } else { 0 };
                }
            });
            let large = if root { root_large } else { g.large_pages().get() };
            let own = if root { root_own } else { t.obj_pages(g) };
            let usage = g.counter().usage();
            let name = g.name().as_str();
            assert!(usage < usize::MAX / 2, "usage of {name} wrapped: {usage}");
            let stocked = g.counter().stocked();
            assert_eq!(usage, own + stocked + large + children, "accounting of group {name}");
            if !root {
                // Its object pages hold its live objects' bytes and its
                // spare, under a page (the object stocks were drained).
                let mut live = 0;
                t.for_each_charged(|_, c| {
                    let size = c.cache.geometry().size;
                    c.cache.for_each_allocated(|_, o, _| live += if o == g.key() { size } else { 0 });
                });
                let spare = t.obj_spare(g);
                assert!(spare < PAGE_SIZE, "spare of group {name}: {spare}");
                assert_eq!(live + spare, own * PAGE_SIZE, "object bytes of group {name}");
            }
            // What the group's slabs and large objects hold, node by node
            // (objects charged one by one are not counted by node).
            let on_nodes: usize = (0..MAX_NODES).map(|n| g.counter().node_pages(n)).sum();
            let slabs = if root { own } else { 0 };
            assert_eq!(on_nodes, slabs + large, "pages on nodes of group {name}");
        });
    }
}
