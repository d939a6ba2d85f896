//! A tutorial kernel's heap tests, our own code, shared by the demo
//! kernels (`kernel-demo`, `kernel-demo/aarch64`) and the Cortex-M
//! program (`kernel-demo/cortex-m`) through this crate: one `Box`, a
//! `Vec<u64>` pushed to 1,000 elements, as many short-lived boxes as a
//! 100 KiB heap has bytes, and a long-lived box held across that churn,
//! all through the global allocator.
//!
//! The kernels run it with `heap=KIB` on their command line (QEMU's
//! `-append`): their heap then gets only that many KiB of RAM (issue 29:
//! 100 KiB and 64 KiB must do). Every allocation here is fallible, so a
//! shortage names the step and the iteration it happened at instead of
//! reaching the allocation error handler; the kernel then prints
//! `Kmem::last_oom()`.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::alloc::Layout;
use core::fmt;
use core::hint::black_box;

/// Short-lived boxes in each churn step: the tutorial's count, as many as
/// its 100 KiB heap has bytes.
pub const CHURN: u64 = 100 * 1024;

/// Elements the vector is pushed to.
pub const VEC_LEN: u64 = 1000;

/// The step that failed, and at which iteration (0 where there is one).
#[derive(Clone, Copy, Debug)]
pub struct Failed {
    /// The step's name.
    pub step: &'static str,
    /// The iteration that failed.
    pub at: u64,
    /// What failed: an allocation, or a value read back.
    pub what: &'static str,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed at iteration {}: {}", self.step, self.at, self.what)
    }
}

/// `Box::new(value)` that returns `None` when the global allocator has no
/// memory, instead of calling the allocation error handler (`Box::try_new`
/// is unstable).
fn try_box<T>(value: T) -> Option<Box<T>> {
    const { assert!(size_of::<T>() > 0, "no zero-sized values: the global allocator forbids them") };
    let layout = Layout::new::<T>();
    // SAFETY: a layout of non-zero size (checked above).
    let p = unsafe { alloc::alloc::alloc(layout) }.cast::<T>();
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is a fresh block of the global allocator with `T`'s
    // layout, written once here; the `Box` then owns it and frees it with
    // that layout, as `Box::new`'s would be.
    unsafe {
        p.write(value);
        Some(Box::from_raw(p))
    }
}

/// Runs the four steps in order, calling `passed` with each one's name
/// once it passed. Values go through `black_box`, so the compiler cannot
/// elide an allocation.
pub fn run(mut passed: impl FnMut(&'static str)) -> Result<(), Failed> {
    let fail = |step, at, what| Failed { step, at, what };

    let step = "simple allocation";
    let a = try_box(41u64).ok_or(fail(step, 0, "a box"))?;
    let b = try_box(13u64).ok_or(fail(step, 1, "a box"))?;
    if *black_box(&*a) + *black_box(&*b) != 54 {
        return Err(fail(step, 0, "the boxes' values"));
    }
    drop((a, b));
    passed(step);

    let step = "large vec";
    let mut v: Vec<u64> = Vec::new();
    for i in 0..VEC_LEN {
        v.try_reserve(1).map_err(|_| fail(step, i, "growing the vec"))?;
        v.push(i);
    }
    if black_box(&v).iter().sum::<u64>() != (VEC_LEN - 1) * VEC_LEN / 2 {
        return Err(fail(step, VEC_LEN, "the vec's sum"));
    }
    drop(v);
    passed(step);

    let step = "many boxes";
    churn(step)?;
    passed(step);

    let step = "many boxes, one long-lived";
    let long_lived = try_box(1u64).ok_or(fail(step, 0, "the long-lived box"))?;
    churn(step)?;
    if *black_box(&*long_lived) != 1 {
        return Err(fail(step, CHURN, "the long-lived box's value"));
    }
    drop(long_lived);
    passed(step);
    Ok(())
}

/// [`CHURN`] boxes, each freed before the next.
fn churn(step: &'static str) -> Result<(), Failed> {
    for i in 0..CHURN {
        let x = try_box(i).ok_or(Failed { step, at: i, what: "a short-lived box" })?;
        if *black_box(&*x) != i {
            return Err(Failed { step, at: i, what: "a short-lived box's value" });
        }
    }
    Ok(())
}

/// The heap size `heap=KIB` on a kernel command line asks for, in bytes:
/// the last such word wins; `None` without one (or with a malformed or
/// zero one).
#[allow(dead_code)] // the kernels' use; the Cortex-M program has no command line
pub fn heap_arg(cmdline: &[u8]) -> Option<usize> {
    let mut bytes = None;
    for word in cmdline.split(|&c| c == b' ') {
        let Some(digits) = word.strip_prefix(b"heap=") else { continue };
        let mut kib: usize = 0;
        let mut ok = !digits.is_empty();
        for &d in digits {
            ok &= d.is_ascii_digit();
            kib = kib.saturating_mul(10).saturating_add(usize::from(d.wrapping_sub(b'0')));
        }
        bytes = (ok && kib > 0).then(|| kib.saturating_mul(1024));
    }
    bytes
}
