//! Hardened mode (`--features hardened`): a double free and a foreign free
//! abort the process with a clear message instead of corrupting the heap,
//! and a write after free cannot forge what the allocator hands out (slabs
//! keep free objects in a bitmap, so freed memory holds nothing they read).
//! Each case runs in a child process (this test binary, re-run with an
//! environment variable), since it must end in an abort.

#![cfg(feature = "hardened")]

#[path = "support/child.rs"]
mod child;

use std::alloc::{GlobalAlloc, Layout};

use kmemcg::{CacheFlags, Kmem, OsPages};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

/// Runs `case` in a child and returns (success, stderr).
/// Runs `case` in a child; returns (success, stderr).
fn child(case: &str) -> (bool, String) {
    child::run("KMEMCG_HARDENED_CASE", case)
}

/// The child's side: does what `KMEMCG_HARDENED_CASE` says.
#[test]
fn run_case() {
    let Ok(case) = std::env::var("KMEMCG_HARDENED_CASE") else { return };
    let l = Layout::from_size_align(48, 8).unwrap();
    match case.as_str() {
        // SAFETY: deliberate misuse, in a child process that hardened mode
        // must stop before it corrupts anything.
        "double_free" => unsafe {
            let p = KMEM.alloc(l);
            KMEM.dealloc(p, l);
            KMEM.dealloc(p, l);
        },
        // SAFETY: deliberate misuse, in a child process that hardened mode
        // must stop before it corrupts anything.
        "double_free_later" => unsafe {
            // The object went to a magazine; the second free must still be
            // caught, with other objects allocated in between.
            let p = KMEM.alloc(l);
            let q = KMEM.alloc(l);
            KMEM.dealloc(p, l);
            let r = KMEM.alloc(Layout::from_size_align(200, 8).unwrap());
            KMEM.dealloc(q, l);
            KMEM.dealloc(p, l);
            let _ = r;
        },
        // SAFETY: deliberate misuse, in a child process that hardened mode
        // must stop before it corrupts anything.
        "foreign_free" => unsafe {
            let mut on_stack = [0u64; 6];
            KMEM.dealloc(on_stack.as_mut_ptr().cast(), l);
        },
        // SAFETY: deliberate misuse, in a child process that hardened mode
        // must stop before it corrupts anything.
        "null_free" => unsafe {
            let p = KMEM.alloc(l);
            KMEM.dealloc(core::ptr::null_mut(), l);
            KMEM.dealloc(p, l);
        },
        "typed_double_free" => {
            let c = KMEM.create_cache::<[u64; 4]>("hardened-objs", CacheFlags::NONE).unwrap();
            let b = c.alloc([1; 4]).unwrap();
            // Forge a second owner of the same object: a double free.
            let p: *const [u64; 4] = &*b;
            // SAFETY: deliberate misuse, in a child process that hardened
            // mode must stop before it corrupts anything.
            unsafe {
                let twin: kmemcg::CacheBox<'_, [u64; 4], kmemcg::Kmem<OsPages>> = std::ptr::read(&b as *const _);
                drop(b);
                let _ = p;
                drop(twin);
            }
        }
        // SAFETY: deliberate misuse, in a child process that hardened mode
        // must stop before it corrupts anything.
        "forged_link" => unsafe {
            // Objects back in their slabs (every 8th kept live so the slabs
            // stay), then a write after free plants a pointer to a stack
            // buffer in each, as an attack on an intrusive free list
            // would: the slabs must hand out only their own objects.
            let ps: Vec<*mut u8> = (0..4096).map(|_| KMEM.alloc(l)).collect();
            for (i, &p) in ps.iter().enumerate() {
                if i % 8 != 0 {
                    KMEM.dealloc(p, l);
                }
            }
            KMEM.shrink();
            let mut target = [0u64; 8];
            for (i, &p) in ps.iter().enumerate() {
                if i % 8 != 0 {
                    p.cast::<*mut u64>().write_unaligned(target.as_mut_ptr());
                }
            }
            let mut got: Vec<*mut u8> = (0..4096).map(|_| KMEM.alloc(l)).collect();
            for &q in &got {
                assert_ne!(q.cast::<u64>(), target.as_mut_ptr(), "a forged link was followed");
            }
            // Every one a distinct 48-byte block, none overlapping a live one.
            got.extend(ps.iter().step_by(8));
            got.sort();
            assert!(got.windows(2).all(|w| w[1].addr() - w[0].addr() >= 48), "overlapping blocks");
        },
        // SAFETY: a valid layout, freed once.
        "clean" => unsafe {
            let p = KMEM.alloc(l);
            KMEM.dealloc(p, l);
        },
        other => panic!("unknown case {other}"),
    }
}

#[test]
fn double_free_aborts_with_a_message() {
    let (ok, err) = child("double_free");
    assert!(!ok, "a double free did not stop the process");
    assert!(err.contains("kmemcg: double free"), "{err}");
}

#[test]
fn double_free_through_a_magazine_is_caught() {
    let (ok, err) = child("double_free_later");
    assert!(!ok);
    assert!(err.contains("kmemcg: double free"), "{err}");
}

#[test]
fn typed_cache_double_free_is_caught() {
    let (ok, err) = child("typed_double_free");
    assert!(!ok);
    assert!(err.contains("kmemcg: double free"), "{err}");
}

#[test]
fn foreign_free_aborts_with_a_message() {
    let (ok, err) = child("foreign_free");
    assert!(!ok);
    assert!(err.contains("kmemcg: free of a pointer that no cache owns"), "{err}");
}

#[test]
fn null_free_aborts_with_a_message() {
    // Release builds without `hardened` trust `GlobalAlloc`'s contract
    // (a freed pointer is never null) and do not test it.
    let (ok, err) = child("null_free");
    assert!(!ok);
    assert!(err.contains("kmemcg: free of a pointer that no cache owns"), "{err}");
}

#[test]
fn write_after_free_cannot_forge_an_allocation() {
    let (ok, err) = child("forged_link");
    assert!(ok, "{err}");
}

#[test]
fn clean_program_runs_normally() {
    let (ok, err) = child("clean");
    assert!(ok, "{err}");
}
