//! A drain on `Threads` whose `membarrier` the kernel refuses stops the
//! program instead of going on (a reap, which may skip a slot, leaves
//! that slot alone instead): slot holders there fence with the compiler
//! alone, so without the barrier a drain could empty the magazines a
//! holder is using (a review helper counted 137,000 overlaps in 8 s
//! before `heavy_barrier` checked the call). The refusal comes from a
//! seccomp filter installed on the draining thread after the process
//! registered for membarrier, as a sandboxing library might install one.
//! In a child process (this binary, re-run), since it must end in an
//! abort.

#![cfg(target_os = "linux")]

#[path = "support/child.rs"]
mod child;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::mpsc;

use kmemcg::{Detection, Kmem, OsPages};

/// Detection off whatever `KMEMCG_DEBUG` says (CI runs every test with it
/// on too): the frees must go to the holder's magazines, not a quarantine.
static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new()).with_detection(Detection::OFF);

/// Makes `membarrier` fail with `EPERM` on the calling thread (and allows
/// every other system call).
fn refuse_membarrier() {
    let filter = [
        // Load the system call number.
        libc::sock_filter { code: 0x20, jt: 0, jf: 0, k: 0 },
        // membarrier: the next rule; anything else: skip it.
        libc::sock_filter { code: 0x15, jt: 0, jf: 1, k: libc::SYS_membarrier as u32 },
        libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32 },
        libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: libc::SECCOMP_RET_ALLOW },
    ];
    let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
    // SAFETY: `prog` points at a valid filter that lives across the call;
    // the kernel copies it. No new privileges is required to install one.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog), 0);
    }
}

/// Objects of the 64-byte class out of its slabs (live or cached in
/// magazines), from the `slabinfo` report.
fn out_of_slabs_64() -> usize {
    let report = KMEM.slabinfo().to_string();
    let row = report.lines().find(|l| l.starts_with("kmalloc-64 ")).expect("a kmalloc-64 row");
    row.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The child's side.
#[test]
fn run_case() {
    let Ok(case) = std::env::var("KMEMCG_MEMBARRIER_CASE") else { return };
    let l = Layout::from_size_align(64, 8).unwrap();
    // A thread that claims a slot, fills its magazines and stays alive,
    // idle, so a drain of its slot needs the handshake (and the barrier).
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        // SAFETY: valid layouts; every block freed once.
        unsafe {
            let ps: Vec<*mut u8> = (0..100).map(|_| KMEM.alloc(l)).collect();
            for p in ps {
                KMEM.dealloc(p, l);
            }
        }
        ready_tx.send(()).unwrap();
        done_rx.recv().unwrap();
    });
    ready_rx.recv().unwrap();
    if case.starts_with("refused") {
        refuse_membarrier();
    }
    if case == "refused_reap" {
        // Reaps may skip a slot: one whose barrier fails is left alone
        // (and the second reap would drain the idle holder's slot).
        KMEM.reap();
        KMEM.reap();
        assert!(out_of_slabs_64() > 0, "a reap drained a slot without its barrier");
    } else {
        // Drains every slot's magazines, the idle holder's among them.
        KMEM.shrink();
        KMEM.reap();
        KMEM.reap();
        assert_eq!(out_of_slabs_64(), 0, "the holder's magazines were not drained");
    }
    done_tx.send(()).unwrap();
    holder.join().unwrap();
    println!("drained");
}

#[test]
fn a_refused_membarrier_stops_the_drain() {
    // MEMBARRIER_CMD_QUERY: the commands the kernel supports. Without
    // PRIVATE_EXPEDITED holders fence in full, and no drain asks for it.
    // SAFETY: a query touches no memory.
    let supported = unsafe { libc::syscall(libc::SYS_membarrier, 0, 0, 0) };
    if supported < 0 || supported & (1 << 3) == 0 {
        eprintln!("no membarrier(PRIVATE_EXPEDITED) here: nothing to refuse");
        return;
    }
    let out = child::output("KMEMCG_MEMBARRIER_CASE", "refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the drain went on without its barrier: {err}");
    assert!(err.contains("kmemcg: membarrier(PRIVATE_EXPEDITED) failed"), "{err}");
}

#[test]
fn a_reap_without_its_barrier_leaves_the_slot_alone() {
    let out = child::output("KMEMCG_MEMBARRIER_CASE", "refused_reap");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("drained"));
}

#[test]
fn an_allowed_membarrier_drains() {
    let out = child::output("KMEMCG_MEMBARRIER_CASE", "allowed");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("drained"));
}
