//! Typed caches through the heap: allocation, out of memory, slabinfo
//! rows, and creating a cache when the page source is dry.

use core::alloc::{GlobalAlloc, Layout};
use std::boxed::Box;
use std::string::ToString;
use std::vec::Vec;

use super::heap::region_kmem;
use crate::CacheFlags;
use crate::error::Error;
use crate::heap::Kmem;
use crate::platform::{DefaultRawMutex, PageSource, Region};

#[repr(C, align(8192))]
struct OverAligned(u8);

#[derive(Debug, PartialEq)]
struct Dentry {
    name: [u8; 40],
    parent: usize,
    hash: u64,
}

#[test]
fn typed_caches() {
    let k = region_kmem(8 << 20);
    assert_eq!(k.create_cache::<u64>("", CacheFlags::NONE).err(), Some(Error::NameEmpty));
    assert_eq!(k.create_cache::<u64>(&"x".repeat(33), CacheFlags::NONE).err(), Some(Error::NameTooLong));
    assert_eq!(k.create_cache::<OverAligned>("big", CacheFlags::NONE).err(), Some(Error::BadLayout));
    assert_eq!(k.create_cache::<[u8; 2 << 20]>("huge", CacheFlags::NONE).err(), Some(Error::BadLayout));
    let dentries = k.create_cache::<Dentry>("dentry", CacheFlags::HWCACHE_ALIGN).unwrap();
    assert_eq!(k.create_cache::<u64>("dentry", CacheFlags::NONE).err(), Some(Error::NameTaken));
    let boxes: Vec<_> = (0..1000)
        .map(|i| dentries.alloc(Dentry { name: [i as u8; 40], parent: i, hash: i as u64 * 7 }).unwrap())
        .collect();
    for (i, b) in boxes.iter().enumerate() {
        assert_eq!(b.parent, i);
        assert_eq!(&**b as *const Dentry as usize % 64, 0, "cache-line aligned");
    }
    // Objects out of the slabs: the live ones plus what the magazines hold.
    let out = dentries.stats().active_objects;
    assert!((1000..=1000 + 2 * 64).contains(&out), "{out}");
    let info = k.slabinfo().to_string();
    let row = info.lines().find(|l| l.starts_with("dentry ")).expect("dentry row");
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], out.to_string(), "{row}");
    assert_eq!(cols[3], "64", "{row}");
    drop(boxes);
    dentries.shrink();
    assert_eq!(dentries.stats().active_objects, 0);
    k.check();
    drop(dentries);
    assert!(!k.slabinfo().to_string().contains("dentry "), "destroyed caches leave the report");
    // Re-creating reuses the descriptor: create/destroy cycles do not grow.
    let before = k.tree().descriptors.stats().active_objects;
    for _ in 0..100 {
        let c = k.create_cache::<Dentry>("dentry", CacheFlags::HWCACHE_ALIGN).unwrap();
        let b = c.alloc(Dentry { name: [0; 40], parent: 1, hash: 2 }).unwrap();
        assert_eq!(b.hash, 2);
    }
    assert_eq!(k.tree().descriptors.stats().active_objects, before);
    k.shrink();
    assert_eq!(k.source().stats().pages_in_use, k.tree().descriptors.stats().pages);
}

#[test]
fn typed_cache_out_of_memory_is_an_error() {
    let k = region_kmem(1 << 20);
    let c = k.create_cache::<[u8; 4000]>("blobs", CacheFlags::NONE).unwrap();
    let mut held = Vec::new();
    let err = loop {
        match c.alloc([7; 4000]) {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
    };
    assert_eq!(err, Error::OutOfMemory);
    assert!(held.len() > 100);
    assert!(held.iter().all(|b| b.iter().all(|&x| x == 7)));
}

#[test]
fn slabinfo_rows_parse() {
    let k = region_kmem(4 << 20);
    let l = Layout::from_size_align(100, 8).unwrap();
    // SAFETY: valid layout; freed below.
    let p = unsafe { k.alloc(l) };
    let info = k.slabinfo().to_string();
    let mut lines = info.lines();
    assert!(lines.next().unwrap().starts_with("slabinfo - version"));
    assert!(lines.next().unwrap().starts_with("# name"));
    let mut seen = 0;
    for line in lines {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols.len(), 12, "{line}");
        for c in &cols[1..11] {
            c.parse::<usize>().unwrap();
        }
        if cols[0] == "kmalloc-112" {
            assert!(cols[1].parse::<usize>().unwrap() >= 1, "{line}");
            seen += 1;
        }
    }
    assert_eq!(seen, 1);
    // SAFETY: freed once.
    unsafe { k.dealloc(p, l) };
    k.shrink();
    assert!(k.class_cache(100, 8).unwrap().stats().active_objects == 0);
}

/// A typed cache made when the page source is dry while the magazines hold
/// freed objects (and so keep their slabs): contention reclaim gives those
/// slabs back and the descriptor is made, as a group's metadata is (it
/// failed with `OutOfMemory`).
#[test]
fn create_cache_reclaims_when_the_source_is_dry() {
    let k: &'static Kmem<Region, DefaultRawMutex, crate::platform::NoCpus> =
        Box::leak(Box::new(Kmem::with_platform(Region::new(), crate::platform::NoCpus::new())));
    // Page-aligned, so the region's pages are all usable.
    let mem = crate::testutil::arena(36 << 10);
    let skew = mem.as_ptr().addr().next_multiple_of(4096) - mem.as_ptr().addr();
    k.source().add(&mut mem[skew..skew + (32 << 10)], 0).unwrap();
    let l = Layout::from_size_align(64, 8).unwrap();
    let mut objs = Vec::new();
    loop {
        // SAFETY: a valid layout; every object is freed below.
        let p = unsafe { k.alloc(l) };
        if p.is_null() {
            break;
        }
        objs.push(p);
    }
    for p in objs {
        // SAFETY: allocated above with `l`.
        unsafe { k.dealloc(p, l) };
    }
    let held = k.source().stats().pages_in_use;
    let c = k.create_cache::<[u64; 8]>("after-dry", crate::CacheFlags::NONE);
    assert!(c.is_ok(), "{:?} with {held} pages in use", c.err());
}

/// A type too large for detection's padding is refused (`BadLayout`).
/// On 32-bit targets, whose types may take up to `isize::MAX` bytes, its
/// size plus the padding once overflowed (a panic in a user's debug build);
/// on 64-bit ones types stop at 2^47 bytes, so this checks the refusal.
#[test]
fn a_huge_type_with_detection_on_is_a_bad_layout() {
    type Huge = [u8; 1 << 46];
    let k: &'static Kmem = Box::leak(Box::new(Kmem::new(crate::OsPages::new()).with_detection(crate::Detection::ALL)));
    assert_eq!(k.create_cache::<Huge>("huge", CacheFlags::NONE).err(), Some(Error::BadLayout));
    assert_eq!(k.create_cache::<[u8; 2 << 20]>("big", CacheFlags::NONE).err(), Some(Error::BadLayout));
    assert!(k.create_cache::<u64>("small", CacheFlags::NONE).is_ok());
}
