//! `PageSource::claim_pages` is safe, so it must turn away any address,
//! not only the end of a live run. A review found that an address off a
//! page boundary passed its checks in the buddy (which rounds down to
//! find the free blocks): the claim wrote a free-list link at an address
//! off a page (a misaligned write) and later handed out runs that did not
//! start on a page. Both sources built on the buddy (`Region`, `OsPages`)
//! are checked: every address off a page boundary near a live run is
//! refused and changes nothing, every run handed out afterwards is page
//! aligned, and a claim at the run's end still works.

use std::mem::MaybeUninit;
use std::ptr::NonNull;

use kmemcg::{OsPages, PAGE_SIZE, PageSource, Region};

/// Offsets into a page that are not its start.
const OFF_PAGE: [usize; 6] = [1, 8, 64, 100, PAGE_SIZE / 2, PAGE_SIZE - 1];

fn refuses_claims_off_page_boundaries(src: &dyn PageSource) {
    let run = src.alloc_pages(0, 0).expect("a page");
    let base = run.addr.as_ptr();
    let before = src.stats().pages_in_use;
    // Around the live page: the pages before and after it are free or
    // someone else's; none may be claimed from an address off a page.
    for page in -8isize..8 {
        for off in OFF_PAGE {
            let at = base.wrapping_offset(page * PAGE_SIZE as isize).wrapping_add(off);
            let at = NonNull::new(at).unwrap();
            for pages in [1, 2, 3] {
                assert!(!src.claim_pages(at, pages), "claimed {pages} pages at {page} pages + {off} bytes");
            }
        }
    }
    assert_eq!(src.stats().pages_in_use, before, "a refused claim changed the count");
    // Every run handed out is still page aligned.
    let mut runs = Vec::new();
    for order in [0, 0, 1, 0, 2, 0, 3] {
        let r = src.alloc_pages(order, 0).expect("pages");
        assert_eq!(r.addr.as_ptr().addr() % PAGE_SIZE, 0, "a run of order {order} off a page boundary");
        runs.push((r.addr, order));
    }
    // The claim it is for still works where the page after the run is free.
    let end = NonNull::new(base.wrapping_add(PAGE_SIZE)).unwrap();
    let grown = src.claim_pages(end, 1);
    // SAFETY: each run is live and freed once with its order; a grown run
    // is freed page by page as two order-0 runs (the page source takes
    // runs back piecewise, as `realloc` of a large object does).
    unsafe {
        for (addr, order) in runs {
            src.free_pages(addr, order);
        }
        src.free_pages(run.addr, 0);
        if grown {
            src.free_pages(end, 0);
        }
    }
    assert_eq!(src.stats().pages_in_use, 0);
}

#[test]
fn a_region_refuses_claims_off_page_boundaries() {
    let r: &'static Region = Box::leak(Box::new(Region::new()));
    let mem: &'static mut [MaybeUninit<u8>] = Box::leak(Box::new_uninit_slice(1 << 20));
    r.add(mem, 0).unwrap();
    refuses_claims_off_page_boundaries(r);
}

#[test]
fn os_pages_refuse_claims_off_page_boundaries() {
    let s: &'static OsPages = Box::leak(Box::new(OsPages::new()));
    refuses_claims_off_page_boundaries(s);
}
