//! A review's finding (detection): the README says quarantined objects
//! "stay charged, so reclaim ... give[s] the quarantine back first: it
//! never makes a limit fail". Reclaim flushed the quarantine once, *before*
//! it called the shrinkers; what the shrinkers freed during that reclaim
//! went into the quarantine, still charged, so the reclaim saw no progress
//! and the allocation that asked for it failed with `LimitExceeded` (20 of
//! 200 here), where the same program without detection never fails. Now
//! every shrinker round that freed something flushes the quarantine
//! before the drains that follow it.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Mutex;

use kmemcg::allocator_api2::alloc::Allocator;
use kmemcg::{Detection, Kmem, OsPages, ShrinkControl, Shrinker};

static DET: Kmem = Kmem::new(OsPages::new()).with_detection(Detection::ALL.guard_pages(0));
static OFF: Kmem = Kmem::new(OsPages::new()).with_detection(Detection::OFF);

const OBJ: usize = 20 << 10; // past the largest size class: a page run

fn layout() -> Layout {
    Layout::from_size_align(OBJ, 8).unwrap()
}

/// A cache of objects the program keeps until reclaim asks for them back
/// (a dentry cache, an LRU of buffers): every object it holds is
/// reclaimable.
struct Lru {
    k: &'static Kmem,
    blocks: Mutex<Vec<usize>>,
}

impl Shrinker for Lru {
    fn count(&self, _: &ShrinkControl) -> usize {
        self.blocks.lock().unwrap().len()
    }
    fn scan(&self, _: &ShrinkControl, nr: usize) -> usize {
        let mut b = self.blocks.lock().unwrap();
        let mut n = 0;
        while n < nr {
            let Some(p) = b.pop() else { break };
            // SAFETY: a live block of `self.k` of `layout()`, freed once.
            unsafe { self.k.dealloc(p as *mut u8, layout()) };
            n += 1;
        }
        n
    }
}

static LRU_DET: Lru = Lru { k: &DET, blocks: Mutex::new(Vec::new()) };
static LRU_OFF: Lru = Lru { k: &OFF, blocks: Mutex::new(Vec::new()) };

/// Allocates 200 objects in a group capped at 256 KiB, each kept in the
/// LRU; returns how many allocations failed.
fn failures(k: &'static Kmem, lru: &'static Lru) -> usize {
    k.register_shrinker(lru).unwrap();
    let g = k.root().create_child("lru").unwrap();
    g.set_max(256 << 10).unwrap();
    let a = g.allocator();
    let mut failed = 0;
    for _ in 0..200 {
        match a.allocate(layout()) {
            Ok(p) => lru.blocks.lock().unwrap().push(p.cast::<u8>().as_ptr() as usize),
            Err(_) => failed += 1,
        }
    }
    failed
}

#[test]
fn without_detection_the_shrinker_makes_room_every_time() {
    assert_eq!(failures(&OFF, &LRU_OFF), 0);
}

#[test]
fn with_detection_the_quarantine_does_not_make_a_limit_fail() {
    let f = failures(&DET, &LRU_DET);
    assert_eq!(f, 0, "{f} of 200 allocations failed at the group's max with detection on");
}

static NOQ: Kmem = Kmem::new(OsPages::new()).with_detection(Detection::ALL.guard_pages(0).quarantine(0));
static LRU_NOQ: Lru = Lru { k: &NOQ, blocks: Mutex::new(Vec::new()) };

/// The same checks with no quarantine: no failure, so the quarantine is
/// what makes the limit fail.
#[test]
fn with_detection_but_no_quarantine_the_shrinker_makes_room_every_time() {
    assert_eq!(failures(&NOQ, &LRU_NOQ), 0);
}
