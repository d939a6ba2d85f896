use super::*;

#[test]
fn a_failed_getcpu_is_node_0() {
    assert_eq!(node_from(-1, 3, 4), 0);
    assert_eq!(node_from(-1, 0, 1), 0);
}

#[test]
fn getcpu_nodes_fold_below_the_node_count() {
    assert_eq!(node_from(0, 1, 2), 1);
    assert_eq!(node_from(0, 3, 4), 3);
    // A memoryless node, or one beyond MAX_NODES.
    assert_eq!(node_from(0, 1, 1), 0);
    assert_eq!(node_from(0, 5, 4), 1);
    // A count of 0 (never produced) still gives node 0.
    assert_eq!(node_from(0, 7, 0), 0);
}

#[test]
fn a_failed_get_mempolicy_is_one_node() {
    assert_eq!(nodes_from(-1, &[0b11]), 1);
    assert_eq!(nodes_from(0, &[0, 0]), 1);
}

#[test]
fn node_count_is_highest_allowed_node_plus_one() {
    assert_eq!(nodes_from(0, &[0b1]), 1);
    assert_eq!(nodes_from(0, &[0b11]), 2);
    // A cpuset of nodes {1, 2}: ids are kept, node 0 is simply unused.
    assert_eq!(nodes_from(0, &[0b110]), 3);
    // Beyond MAX_NODES: clamped.
    assert_eq!(nodes_from(0, &[0, 1]), MAX_NODES);
}

/// This machine has one node (and the count matches sysfs where it has
/// more): the getcpu path answers node 0.
#[test]
fn this_host() {
    let n = nodes();
    assert!((1..=MAX_NODES).contains(&n));
    assert!(current_node() < n);
    let sysfs = std::fs::read_dir("/sys/devices/system/node")
        .map(|d| d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with("node")).count())
        .unwrap_or(1);
    if sysfs <= 1 {
        assert_eq!(n, 1);
        assert_eq!(current_node(), 0);
    }
}

/// `NumaThreads` on this host: the claim asked `getcpu` (or skipped it on
/// one node) and the slot's node is below the count, node 0 on one node.
#[test]
fn numa_threads_slot_node() {
    use crate::platform::{NumaThreads, Platform};
    let p = NumaThreads::new();
    // SAFETY: this thread holds no slot of the platform here, and nothing
    // on it allocates through a kmemcg allocator between enter and exit.
    let Some(slot) = (unsafe { p.enter() }) else { return };
    let (node, nodes) = (p.node_of(slot), p.nodes());
    // SAFETY: entered above.
    unsafe { p.exit(slot) };
    assert_eq!(nodes, super::nodes());
    assert!(node < nodes);
    if nodes == 1 {
        assert_eq!(node, 0);
    }
}

/// A bind the kernel refuses (a node this host does not have; on a kernel
/// without NUMA every bind) leaves the mapping as it was: usable, its pages
/// wherever first touched.
#[test]
fn a_refused_bind_leaves_the_mapping_usable() {
    const LEN: usize = 64 * 1024;
    let p = crate::platform::os::map_for_test(LEN);
    let nodes = nodes();
    // SAFETY: a fresh mapping of ours.
    assert_eq!(unsafe { mbind(p, LEN, nodes) }, -1);
    // SAFETY: as above (a node beyond a word is refused without a call).
    assert_eq!(unsafe { mbind(p, LEN, 200) }, -1);
    // SAFETY: as above; a no-op on one node.
    unsafe { bind(p, LEN, 3) };
    // SAFETY: the mapping is LEN bytes, readable and writable.
    unsafe {
        core::ptr::write_bytes(p, 0xa5, LEN);
        assert_eq!(*p.add(LEN - 1), 0xa5);
    }
    // SAFETY: node 0 exists on every host this runs on (or the call fails
    // without NUMA): either way nothing changes but the policy.
    let r = unsafe { mbind(p, LEN, 0) };
    assert!(r == 0 || r == -1);
    crate::platform::os::unmap_for_test(p, LEN);
}
