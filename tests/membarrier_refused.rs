//! A drain on `Threads` whose `membarrier` the kernel refuses stops the
//! program instead of going on: slot holders there fence with the compiler
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

use kmemcg::{Kmem, OsPages};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

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
    if case == "refused" {
        refuse_membarrier();
    }
    // Drains every slot's magazines, the idle holder's among them.
    KMEM.shrink();
    KMEM.reap();
    KMEM.reap();
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
fn an_allowed_membarrier_drains() {
    let out = child::output("KMEMCG_MEMBARRIER_CASE", "allowed");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("drained"));
}
