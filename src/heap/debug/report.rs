//! What reports print: the bytes that changed in a checked range, and
//! the name of the cache an object is in.

use core::fmt;

use lock_api::RawMutex;

use super::W;
use crate::cgroup::class_name;
use crate::error::Name;
use crate::heap::Kmem;
use crate::magazine::MagCache;
use crate::platform::{PageSource, Platform};
use crate::slab::classes::class_of;

/// The first and last offsets in `p[from..to]` that differ from `byte`.
///
/// # Safety
///
/// `p[from..to]` is readable.
unsafe fn changed(p: *const u8, from: usize, to: usize, byte: u8) -> Option<(usize, usize)> {
    // Word by word first (the common case: nothing changed), then the
    // bytes of a word that differs, from each end.
    let word = usize::from_ne_bytes([byte; W]);
    let mut i = from;
    let mut first = None;
    while i < to {
        if to - i >= W {
            // SAFETY: in range, per the contract.
            if unsafe { p.add(i).cast::<usize>().read_unaligned() } == word {
                i += W;
                continue;
            }
        }
        // SAFETY: as above.
        if unsafe { p.add(i).read() } != byte {
            first = Some(i);
            break;
        }
        i += 1;
    }
    let first = first?;
    let mut last = to - 1;
    // SAFETY: `first..to` is in range; `first` itself differs, so the loop
    // stops there at the latest.
    while unsafe { p.add(last).read() } == byte {
        last -= 1;
    }
    Some((first, last))
}

/// Up to 8 bytes of `p` from `at`, for a report.
struct Bytes<'a>(&'a [u8]);

impl fmt::Display for Bytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().take(8).enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Aborts with a report of the bytes of `s[from..to]` (a slot) that
/// should all be `byte`, if any is not; `cache` names the cache (called
/// only then). Offsets are reported from `obj`, the object in the slot
/// (negative: before it), of `size` bytes (`None`: freed).
///
/// # Safety
///
/// `s[from..to]` is readable, `obj` lies in the same slot.
#[allow(clippy::too_many_arguments)] // one report's facts, each used once
pub(super) unsafe fn expect_bytes(
    s: *mut u8,
    from: usize,
    to: usize,
    byte: u8,
    what: &str,
    cache: impl Fn() -> Name,
    obj: *mut u8,
    size: Option<usize>,
) {
    // SAFETY: forwarded.
    if let Some((a, b)) = unsafe { changed(s, from, to, byte) } {
        // SAFETY: `a..=b` lies in the checked range.
        let shown = unsafe { core::slice::from_raw_parts(s.add(a), (b - a + 1).min(8)) };
        let at = obj.addr().wrapping_sub(s.addr()) as isize;
        let (a, b) = (a as isize - at, b as isize - at);
        struct Size(Option<usize>);
        impl fmt::Display for Size {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.0 {
                    Some(n) => write!(f, "{n} bytes"),
                    None => f.write_str("freed"),
                }
            }
        }
        abort_at(
            s,
            format_args!(
                "kmemcg: {what}: cache {}, object {obj:p} ({}), bytes {a}..={b} changed (expected {byte:02x}, found {})",
                cache().as_str(),
                Size(size),
                Bytes(shown)
            ),
        );
    }
}

/// The name of the cache a `padded`-byte request is served from.
pub(super) fn slot_name(padded: usize, align: usize) -> Name {
    class_of(padded, align).map_or(Name::LARGE, class_name)
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// The name of `cache`, found by identity (a typed cache may have a
    /// size class's geometry): its size class's, its typed cache's, or
    /// for a charged cache, that of the cache it charges for.
    pub(super) fn cache_name(&self, cache: &MagCache<R>) -> Name {
        let is = |c: &MagCache<R>| core::ptr::eq(c, cache);
        if let Some(c) = self.tree.classes().iter().position(is) {
            return class_name(c);
        }
        let mut found = None;
        self.tree.for_each_desc(|d| {
            if is(&d.cache) {
                found = Some(d.name);
            }
        });
        if let Some(name) = found {
            return name;
        }
        let mut charged = None;
        self.tree.for_each_charged(|name, c| {
            if is(c) {
                charged = Some(name);
            }
        });
        charged.unwrap_or(Name::UNKNOWN)
    }
}

/// Prints `args` and a newline on standard error, without allocating (a
/// warning: the program goes on).
#[cfg(all(feature = "std", not(loom)))]
pub(super) fn warn(args: fmt::Arguments<'_>) {
    /// Standard error, unbuffered.
    struct Stderr;
    impl fmt::Write for Stderr {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            // SAFETY: a valid buffer written to fd 2; touches no memory of
            // ours and does not allocate.
            unsafe { libc::write(2, s.as_ptr().cast(), s.len()) };
            Ok(())
        }
    }
    let _ = fmt::Write::write_fmt(&mut Stderr, format_args!("{args}\n"));
}

/// Aborts with the report `args` about the object in slot `s`, followed
/// by its allocation and free sites when they are recorded.
#[cold]
pub(super) fn abort_at(s: *mut u8, args: fmt::Arguments<'_>) -> ! {
    #[cfg(all(feature = "std", not(loom), target_os = "linux", target_env = "gnu"))]
    {
        warn(args);
        super::sites::print(s);
        // SAFETY: abort ends the process; nothing runs after it.
        unsafe { libc::abort() }
    }
    #[cfg(not(all(feature = "std", not(loom), target_os = "linux", target_env = "gnu")))]
    {
        let _ = s;
        crate::platform::report_abort(args)
    }
}
