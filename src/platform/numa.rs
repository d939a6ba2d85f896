//! Linux NUMA facts for `Threads` and `OsPages` (feature `std`): the node
//! the calling thread runs on (`getcpu(2)`), the nodes the process may
//! allocate on (`get_mempolicy(2)` with `MPOL_F_MEMS_ALLOWED`), and
//! binding a fresh mapping to a node (`mbind(2)`, `MPOL_PREFERRED`).
//!
//! Every call is a raw `syscall`: none allocates, reads a file or faults,
//! and each failure (a kernel without `CONFIG_NUMA`, a seccomp filter, no
//! permission) has an answer that works unchanged on one node: node 0,
//! one node, an unbound mapping. The handling of each result is a pure
//! function (`node_from`, `nodes_from`) so it can be tested without a
//! kernel that fails.
//!
//! Node ids are the kernel's where they are below
//! [`MAX_NODES`](super::MAX_NODES) and below the node count: a CPU on a
//! node the process may not allocate on (a memoryless node, or one a
//! cpuset leaves out), or on a node numbered beyond what kmemcg tells
//! apart, is folded onto `node % nodes`, so `Platform::node_of` stays
//! below `Platform::nodes`.

use super::MAX_NODES;
use crate::sync::{AtomicUsize, Ordering, atomic_usize};

/// `get_mempolicy` flag: return the nodes the process may use.
const MPOL_F_MEMS_ALLOWED: libc::c_ulong = 1 << 2;
/// `mbind` mode: prefer the node, fall back to others when it is full.
const MPOL_PREFERRED: libc::c_ulong = 1;
/// Words of the node mask `get_mempolicy` fills: 1,024 nodes, the most a
/// Linux kernel is built for (`CONFIG_NODES_SHIFT` 10); the call fails
/// with a mask shorter than the kernel's node count.
const MASK_WORDS: usize = 1024 / libc::c_ulong::BITS as usize;

/// Nodes the process may use, as `nodes_from` counts them; 0: not yet
/// asked.
static NODES: AtomicUsize = atomic_usize(0);

/// The node count from `get_mempolicy`'s result `ret` and the mask it
/// filled: the highest allowed node plus one, at most [`MAX_NODES`]; 1 if
/// the call failed or the mask is empty.
pub(super) fn nodes_from(ret: libc::c_long, mask: &[libc::c_ulong]) -> usize {
    if ret != 0 {
        return 1;
    }
    let bits = libc::c_ulong::BITS as usize;
    let highest = mask
        .iter()
        .enumerate()
        .rev()
        .find(|(_, w)| **w != 0)
        .map(|(i, w)| i * bits + (bits - 1 - w.leading_zeros() as usize));
    highest.map_or(1, |h| (h + 1).min(MAX_NODES))
}

/// The node from `getcpu`'s result `ret` and the node it wrote, folded
/// below `nodes` (at least 1; see the module docs); 0 if the call failed.
pub(super) fn node_from(ret: libc::c_long, node: libc::c_uint, nodes: usize) -> usize {
    let nodes = nodes.max(1);
    if ret != 0 { 0 } else { node as usize % nodes }
}

/// The nodes this process may allocate on, counted once (the first call
/// asks the kernel; later ones load). 1 on a kernel without NUMA.
pub(super) fn nodes() -> usize {
    // Relaxed: the value is the same whichever thread computes it, and
    // carries no other data.
    match NODES.load(Ordering::Relaxed) {
        0 => {
            let n = ask_nodes();
            NODES.store(n, Ordering::Relaxed);
            n
        }
        n => n,
    }
}

/// Asks the kernel which nodes the process may use (see [`nodes_from`]).
fn ask_nodes() -> usize {
    if cfg!(miri) {
        return 1;
    }
    let mut mask = [0 as libc::c_ulong; MASK_WORDS];
    let mut mode: libc::c_int = 0;
    // SAFETY: `mode` and `mask` are valid out-pointers, and `mask` holds
    // the `MASK_WORDS * BITS` bits the call is told it has; the call
    // writes nothing else and allocates nothing.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            (MASK_WORDS * libc::c_ulong::BITS as usize) as libc::c_ulong,
            core::ptr::null_mut::<libc::c_void>(),
            MPOL_F_MEMS_ALLOWED,
        )
    };
    nodes_from(ret, &mask)
}

/// The node the calling thread runs on now, below [`nodes`]; 0 if the
/// kernel cannot tell. A syscall: for slow paths only.
pub(super) fn current_node() -> usize {
    let nodes = nodes();
    if nodes <= 1 {
        return 0;
    }
    let mut cpu: libc::c_uint = 0;
    let mut node: libc::c_uint = 0;
    // SAFETY: two valid `unsigned` out-pointers; the third argument is
    // unused since Linux 2.6.24 and may be null.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut libc::c_uint,
            &mut node as *mut libc::c_uint,
            core::ptr::null_mut::<libc::c_void>(),
        )
    };
    node_from(ret, node, nodes)
}

/// Asks the kernel to place the pages of `[addr, addr + len)` on `node`
/// (preferred: other nodes when it is full). Does nothing with one node,
/// and ignores failure (no NUMA, no such node, not permitted): the pages
/// then go where first touched.
///
/// # Safety
///
/// `[addr, addr + len)` is a page-aligned piece of an anonymous mapping
/// the caller made and owns (the call changes only its policy).
pub(super) unsafe fn bind(addr: *mut u8, len: usize, node: usize) {
    if cfg!(miri) || nodes() <= 1 {
        return;
    }
    // SAFETY: forwarded.
    let _ = unsafe { mbind(addr, len, node) };
}

/// The `mbind(MPOL_PREFERRED)` call of [`bind`], whatever the node count:
/// 0 or -1 (a node beyond a word's bits is refused here).
///
/// # Safety
///
/// As for [`bind`].
unsafe fn mbind(addr: *mut u8, len: usize, node: usize) -> libc::c_long {
    if node >= libc::c_ulong::BITS as usize {
        return -1;
    }
    let mask: libc::c_ulong = 1 << node;
    // SAFETY: per the contract the range is ours; `mask` is one readable
    // word, and `maxnode` is its bit count plus one (the kernel reads
    // `maxnode - 1` bits).
    unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr.cast::<libc::c_void>(),
            len,
            MPOL_PREFERRED,
            &mask as *const libc::c_ulong,
            libc::c_ulong::BITS as libc::c_ulong + 1,
            0 as libc::c_uint,
        )
    }
}

#[cfg(test)]
mod tests;
