//! The boot-time self-test, on the boot CPU alone: collections over the
//! global allocator, a typed cache, and two limited groups.

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write as _;

use kmemcg::{CacheFlags, Error};

use crate::arch::{Arch, Heap};
use crate::kprintln;

type Test = Result<(), &'static str>;

/// Tenant A's hard limit; tenant B's is four times as much.
const LIMIT_A: usize = 1 << 20;

fn check(ok: bool, what: &'static str) -> Test {
    if ok { Ok(()) } else { Err(what) }
}

/// Runs every test, printing as it goes.
pub fn run<A: Arch>() -> Test {
    let kmem = A::heap();
    collections::<A>()?;
    typed_cache::<A>(kmem)?;
    groups::<A>(kmem)?;
    report::<A>(kmem);
    check(kmem.stats().bad_frees == 0, "kmemcg saw frees of pointers it does not own")
}

fn collections<A: Arch>() -> Test {
    let v: Vec<u64> = (0..100_000).collect(); // 800 KB: the large-object path
    check(v.iter().sum::<u64>() == 100_000 * 99_999 / 2, "Vec<u64> sum")?;

    // 10007 is prime, so these 2000 keys are distinct.
    let key = |i: u32| i * 7919 % 10007;
    let map: BTreeMap<u32, String> = (0..2000).map(|i| (key(i), format!("value-{i}"))).collect();
    check(map.len() == 2000, "BTreeMap length")?;
    check((0..2000).all(|i| map[&key(i)] == format!("value-{i}")), "BTreeMap contents")?;
    check(map.keys().zip(map.keys().skip(1)).all(|(a, b)| a < b), "BTreeMap order")?;

    let mut s = String::new();
    for i in 0..1000u32 {
        s.push(char::from(b'a' + (i % 26) as u8));
    }
    check(s.len() == 1000 && s.starts_with("abcdefghijklmnopqrstuvwxyzab"), "String contents")?;

    let boxed: Box<[u64; 512]> = Box::new([7; 512]);
    let f: Box<dyn Fn(u64) -> u64> = Box::new(move |x| x + boxed.iter().sum::<u64>());
    check(f(1) == 1 + 7 * 512, "Box<[u64; 512]> and Box<dyn Fn>")?;

    let big = alloc::vec![0xA5u8; 3 << 20];
    check(big.iter().all(|&b| b == 0xA5), "3 MiB Vec<u8> contents")?;
    kprintln!(A; "collections: Vec, BTreeMap, String, Box ok");
    Ok(())
}

/// An object for a typed cache.
struct Inode {
    ino: u64,
    nlink: u32,
    name: [u8; 20],
}

fn typed_cache<A: Arch>(kmem: &'static Heap<A::Cpu>) -> Test {
    let inodes = kmem.create_cache::<Inode>("inode", CacheFlags::ACCOUNT).map_err(|_| "create_cache(inode)")?;
    let mut live = Vec::with_capacity(5000);
    for i in 0..5000u64 {
        let inode = Inode { ino: i, nlink: (i % 3) as u32, name: [(i % 251) as u8; 20] };
        live.push(inodes.alloc(inode).map_err(|_| "inode cache allocation")?);
    }
    let ok = live.iter().enumerate().all(|(i, n)| {
        let i = i as u64;
        n.ino == i && n.nlink == (i % 3) as u32 && n.name == [(i % 251) as u8; 20]
    });
    check(ok, "inode contents")?;
    let st = inodes.stats();
    kprintln!(A; "typed cache 'inode': {} objects in {} slabs ({} pages)", st.active_objects, st.slabs, st.pages);
    check(st.active_objects >= 5000, "inode cache statistics")?;
    live.truncate(1000); // frees 4000
    check(inodes.stats().active_objects >= 1000, "inode cache after frees")?;
    drop(live);
    kprintln!(A; "typed cache 'inode': 5000 allocated, verified, freed");
    Ok(())
}

/// A 512-byte object for the groups test.
struct Packet {
    seq: u64,
    data: [u8; 504],
}

fn groups<A: Arch>(kmem: &'static Heap<A::Cpu>) -> Test {
    let root = kmem.root();
    let a = root.create_child("tenant-a").map_err(|_| "create_child(tenant-a)")?;
    let b = root.create_child("tenant-b").map_err(|_| "create_child(tenant-b)")?;
    a.set_max(LIMIT_A).map_err(|_| "set_max(tenant-a)")?;
    b.set_max(4 * LIMIT_A).map_err(|_| "set_max(tenant-b)")?;
    let packets = kmem.create_cache::<Packet>("packet", CacheFlags::ACCOUNT).map_err(|_| "create_cache(packet)")?;

    // Room for more packets than the limit allows, charged to the root
    // (allocated before entering the group).
    let mut held_a = Vec::with_capacity(2 * LIMIT_A / 512);
    let (err, big) = {
        let _in = a.enter();
        let err = loop {
            if held_a.len() == held_a.capacity() {
                return Err("tenant-a allocated past its limit");
            }
            let seq = held_a.len() as u64;
            match packets.alloc(Packet { seq, data: [seq as u8; 504] }) {
                Ok(p) => held_a.push(p),
                Err(e) => break e,
            }
        };
        // The global allocator charges the entered group too: this fails
        // cleanly instead of aborting.
        let mut v: Vec<u8> = Vec::new();
        (err, v.try_reserve_exact(2 * LIMIT_A))
    };
    match err {
        Error::LimitExceeded { group, max } => {
            kprintln!(A; "tenant-a: {} packets of 512 bytes, then {err:?}", held_a.len());
            check(group.as_str() == "tenant-a" && max == LIMIT_A, "tenant-a's error names another limit")?;
        }
        _ => return Err("tenant-a failed with something other than LimitExceeded"),
    }
    check(big.is_err(), "tenant-a reserved 2 MiB past its 1 MiB limit")?;
    kprintln!(A; "tenant-a: Vec::try_reserve_exact(2 MiB) -> Err (clean failure)");
    check(!held_a.is_empty() && held_a.len() * 512 <= LIMIT_A, "tenant-a packet count")?;
    check(held_a.iter().enumerate().all(|(i, p)| p.seq == i as u64 && p.data[503] == i as u8), "tenant-a packets")?;
    check(a.failcnt() > 0 && a.usage() <= LIMIT_A, "tenant-a usage and failcnt")?;

    // Tenant A is full; tenant B is not affected.
    let mut held_b = Vec::with_capacity(2000);
    let v = {
        let _in = b.enter();
        for seq in 0..2000u64 {
            held_b.push(packets.alloc(Packet { seq, data: [1; 504] }).map_err(|_| "tenant-b packet allocation")?);
        }
        let v: Vec<u64> = (0..128 * 1024).collect(); // 1 MiB through the global allocator
        v
    };
    check(v.iter().sum::<u64>() == 128 * 1024 * (128 * 1024 - 1) / 2, "tenant-b Vec contents")?;
    kprintln!(A; "tenant-b: 2000 packets and a 1 MiB Vec while tenant-a is full");
    // Charged: its packets' bytes and the Vec's pages (objects are
    // charged one by one, in bytes, not by the slab).
    let b_live = 2000 * core::mem::size_of::<Packet>() + 128 * 1024 * 8;
    check(b.usage() >= b_live && b.failcnt() == 0, "tenant-b usage")?;

    for g in [&a, &b] {
        kprintln!(A;
            "group {}: usage {} KiB, peak {} KiB, max {} KiB, failcnt {}",
            g.name(),
            g.usage() >> 10,
            g.peak() >> 10,
            g.max() >> 10,
            g.failcnt()
        );
    }
    print_slabinfo::<A>(kmem, &["packet", "inode"]);

    drop((held_a, held_b, v));
    kmem.reap();
    kprintln!(A; "after freeing: tenant-a usage {} KiB, tenant-b usage {} KiB", a.usage() >> 10, b.usage() >> 10);
    drop(packets);
    a.remove().map_err(|_| "remove(tenant-a)")?;
    b.remove().map_err(|_| "remove(tenant-b)")?;
    check(a.is_removed() && b.is_removed(), "groups removed")?;
    kprintln!(A; "groups: tenant-a and tenant-b removed");
    Ok(())
}

/// Prints the two header lines of `slabinfo()` and its rows for `names`.
fn print_slabinfo<A: Arch>(kmem: &'static Heap<A::Cpu>, names: &[&str]) {
    let mut table = String::new();
    if write!(table, "{}", kmem.slabinfo()).is_err() {
        kprintln!(A; "slabinfo: formatting failed");
        return;
    }
    for (i, line) in table.lines().enumerate() {
        if i < 2 || names.iter().any(|n| line.split_whitespace().next() == Some(n)) {
            kprintln!(A; "slabinfo: {line}");
        }
    }
}

fn report<A: Arch>(kmem: &'static Heap<A::Cpu>) {
    let st = kmem.stats();
    kprintln!(A;
        "kmem: {:?}, large objects {} ({} pages), bad frees {}",
        st.source,
        st.large_objects,
        st.large_pages,
        st.bad_frees
    );
}
