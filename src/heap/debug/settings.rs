//! What detection does ([`Detection`]) and the `KMEMCG_DEBUG` syntax.

#[allow(unused_imports)] // the docs' links
use crate::heap::Kmem;
use crate::sync::AtomicUsize;
#[cfg(all(feature = "std", not(loom)))]
use crate::sync::Ordering;

/// What memory-error detection a [`Kmem`] does; see
/// [`Kmem::with_detection`].
///
/// ```
/// use kmemcg::Detection;
/// let d = Detection::ALL.quarantine(256 << 10);
/// assert!(d.redzones_on() && d.poison_on());
/// assert_eq!(Detection::from_env_value(b"redzone,quarantine=64k"), Detection::OFF.redzones(true).quarantine(64 << 10));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Detection {
    pub(super) redzone: bool,
    pub(super) poison: bool,
    pub(super) quarantine: usize,
    pub(super) guard_every: usize,
    pub(super) sites: bool,
}

impl Detection {
    /// No detection: the plain allocator.
    pub const OFF: Detection = Detection { redzone: false, poison: false, quarantine: 0, guard_every: 0, sites: false };
    /// Red zones, poison, a 1 MiB quarantine, and one size-class
    /// allocation in 256 on a guard page.
    pub const ALL: Detection =
        Detection { redzone: true, poison: true, quarantine: 1 << 20, guard_every: 256, sites: false };

    /// Sampling alone at GWP-ASan's default rate, one size-class
    /// allocation in 5,000 on a guard page (at most [`GUARDED_MAX`](crate::GUARDED_MAX)
    /// sampled objects live at once, and at most one sample a millisecond
    /// where the platform has a clock): cheap enough to leave on
    /// (`KMEMCG_DEBUG=sampled`). KFENCE samples one allocation per 100 ms
    /// into a pool of 255 objects; GWP-ASan one in 5,000 into 16 slots by
    /// default.
    pub const SAMPLED: Detection = Detection::sampled(5000);

    /// With the allocation and free sites of checked objects recorded
    /// (`on`) or not, for reports to print (with `std` on glibc targets:
    /// return addresses from `backtrace(3)` into a fixed table, no
    /// allocation; printed as function and offset with their module,
    /// named from the module's symbol table when the report prints). A
    /// few microseconds per allocation and free; needs red zones or
    /// poison, or sampling: then the sampled objects' sites, printed
    /// with a guard-page fault's report (a few microseconds per sample
    /// only).
    pub const fn sites(mut self, on: bool) -> Self {
        self.sites = on;
        self
    }

    /// Whether allocation and free sites are recorded.
    pub const fn sites_on(&self) -> bool {
        self.sites
    }

    /// With red zones checked (`on`) or not.
    pub const fn redzones(mut self, on: bool) -> Self {
        self.redzone = on;
        self
    }

    /// With freed objects poisoned and checked (`on`) or not.
    pub const fn poison(mut self, on: bool) -> Self {
        self.poison = on;
        self
    }

    /// With a quarantine of at most `bytes` globally, and an eighth of it
    /// per CPU slot, which hands its objects to the global one in a batch
    /// when full (0: freed objects are checked and reused at once).
    pub const fn quarantine(mut self, bytes: usize) -> Self {
        self.quarantine = bytes;
        self
    }

    /// With one size-class allocation in `n` placed to end at a page
    /// boundary before an inaccessible page (0: none), so an overflow
    /// faults at the instruction that makes it (KFENCE's idea). Only page
    /// sources that can protect pages (`OsPages`) sample; at most
    /// [`GUARDED_MAX`](crate::GUARDED_MAX) sampled objects live at once.
    /// Only layouts whose size is a multiple of their alignment are
    /// sampled (every Rust type's, and every byte buffer's): a free then
    /// tells a sample by `ptr + size` alone. Alone (no red zones or
    /// poison) at one in 256 or rarer, at most one sample a millisecond
    /// (see [`Detection::sampled`]).
    pub const fn guard_pages(mut self, n: usize) -> Self {
        self.guard_every = n;
        self
    }

    /// Sampling alone, cheap enough to leave on in production (the
    /// idea of KFENCE and GWP-ASan): one size-class allocation in `n` on a
    /// guard page ([`Detection::guard_pages`]), no red zones, poison or
    /// quarantine for the others. At one in 256 or rarer the count runs on
    /// the slow paths, and arms at most one sample per millisecond of the
    /// platform's clock (`Platform::now_ms`): each sample costs two
    /// `mprotect` calls, which at one in 5,000 allocations of a few
    /// nanoseconds each would take several percent of the program's time.
    pub const fn sampled(n: usize) -> Detection {
        Detection::OFF.guard_pages(n)
    }

    /// One allocation in how many is sampled onto a guard page (0: none).
    pub const fn guard_every(&self) -> usize {
        self.guard_every
    }

    /// Whether red zones are checked.
    pub const fn redzones_on(&self) -> bool {
        self.redzone
    }

    /// Whether freed objects are poisoned.
    pub const fn poison_on(&self) -> bool {
        self.poison
    }

    /// The quarantine's bound in bytes.
    pub const fn quarantine_bytes(&self) -> usize {
        self.quarantine
    }

    /// Whether any check is on (sampling included).
    pub const fn is_on(&self) -> bool {
        self.redzone || self.poison || self.guard_every != 0
    }

    /// Detection from a `KMEMCG_DEBUG` value, read without regard to
    /// case, spaces around words ignored:
    ///
    /// * empty, `0`, `false`, `no` or `off`: none;
    /// * `1`, `true`, `yes`, `on` or `all`: [`Detection::ALL`] (red zones,
    ///   poison, a 1 MiB quarantine, guard pages);
    /// * otherwise a comma-separated list of `redzone`, `poison`,
    ///   `quarantine=N` (bytes, with an optional `k` or `m`), `guard=N`
    ///   (one allocation in N on a guard page), `sites` (see
    ///   [`Detection::sites`]), `sampled`
    ///   ([`Detection::SAMPLED`]'s rate) and `all`, later words
    ///   overriding earlier ones. `poison` without a `quarantine=` word
    ///   gets the default 1 MiB quarantine; `sites` without a check
    ///   (red zones, poison or sampling) turns red zones and poison on.
    ///
    /// An unknown word is skipped; if no word of the value was understood,
    /// the result is [`Detection::ALL`] (whoever set the variable wanted
    /// detection). A `Kmem` reading the variable prints one warning
    /// naming the word (with `std`); [`Kmem::detection`] tells what was
    /// taken.
    ///
    /// ```
    /// use kmemcg::Detection;
    /// assert_eq!(Detection::from_env_value(b"Yes"), Detection::ALL);
    /// assert_eq!(Detection::from_env_value(b"poison, guard=64"), Detection::sampled(64).poison(true).quarantine(1 << 20));
    /// assert_eq!(Detection::from_env_value(b"enable"), Detection::ALL);
    /// ```
    pub const fn from_env_value(v: &[u8]) -> Detection {
        parse(v).0
    }
}

/// The default quarantine: [`Detection::ALL`]'s.
const DEFAULT_QUARANTINE: usize = Detection::ALL.quarantine;

/// `v` without ASCII spaces (and tabs, newlines) at either end.
const fn trim(mut v: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = v
        && first.is_ascii_whitespace()
    {
        v = rest;
    }
    while let [rest @ .., last] = v
        && last.is_ascii_whitespace()
    {
        v = rest;
    }
    v
}

/// Whether `a` and `b` are equal, ignoring ASCII case.
const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if !a[i].eq_ignore_ascii_case(&b[i]) {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether `w` is one of `words` (ignoring case).
const fn one_of(w: &[u8], words: &[&[u8]]) -> bool {
    let mut i = 0;
    while i < words.len() {
        if same(w, words[i]) {
            return true;
        }
        i += 1;
    }
    false
}

/// The words that mean "everything" and "nothing".
const ON: &[&[u8]] = &[b"1", b"true", b"yes", b"on", b"all"];
const OFF: &[&[u8]] = &[b"", b"0", b"false", b"no", b"off"];

/// A `KMEMCG_DEBUG` value read: the detection, and the offsets
/// `start..end` in `v` of the first word not understood, if any.
pub(super) const fn parse(v: &[u8]) -> (Detection, Option<(usize, usize)>) {
    let whole = trim(v);
    if one_of(whole, OFF) {
        return (Detection::OFF, None);
    }
    if one_of(whole, ON) {
        return (Detection::ALL, None);
    }
    let mut d = Detection::OFF;
    let (mut known, mut quarantine_set) = (false, false);
    let mut unknown = None;
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j < v.len() && v[j] != b',' {
            j += 1;
        }
        let (word, _) = v.split_at(j);
        let (_, word) = word.split_at(i);
        let word = trim(word);
        let mut ok = true;
        if word.is_empty() {
            // `a,,b` or a trailing comma: nothing to take.
        } else if one_of(word, ON) {
            d = Detection::ALL;
            quarantine_set = true;
        } else if same(word, b"sampled") {
            d.guard_every = Detection::SAMPLED.guard_every;
        } else if same(word, b"redzone") || same(word, b"redzones") {
            d.redzone = true;
        } else if same(word, b"sites") {
            d.sites = true;
        } else if same(word, b"poison") {
            d.poison = true;
        } else if let Some(n) = parse_number(word, b"quarantine=") {
            d.quarantine = n;
            quarantine_set = true;
        } else if let Some(n) = parse_number(word, b"guard=") {
            d.guard_every = n;
        } else {
            ok = false;
            if unknown.is_none() {
                // Offsets into `v` of the trimmed word.
                let start = i + (j - i - word.len()) - count_trailing_space(v, i, j);
                unknown = Some((start, start + word.len()));
            }
        }
        known |= ok && !word.is_empty();
        i = j + 1;
    }
    if !known {
        return (Detection::ALL, unknown);
    }
    if d.sites && !d.is_on() {
        // Sites are recorded only for checked objects: whoever asked for
        // them wants checks, so red zones and poison.
        d.redzone = true;
        d.poison = true;
    }
    if d.poison && !quarantine_set {
        d.quarantine = DEFAULT_QUARANTINE;
    }
    (d, unknown)
}

/// ASCII spaces at the end of `v[from..to]`.
const fn count_trailing_space(v: &[u8], from: usize, mut to: usize) -> usize {
    let end = to;
    while to > from && v[to - 1].is_ascii_whitespace() {
        to -= 1;
    }
    end - to
}

/// `key` (any case) followed by `N[k|m]`, as a number.
const fn parse_number(word: &[u8], key: &[u8]) -> Option<usize> {
    if word.len() <= key.len() {
        return None;
    }
    let (head, _) = word.split_at(key.len());
    if !same(head, key) {
        return None;
    }
    let mut i = key.len();
    let mut n: usize = 0;
    while i < word.len() {
        let shift = match word[i] {
            b'0'..=b'9' => {
                n = match n.checked_mul(10) {
                    Some(m) => m.saturating_add((word[i] - b'0') as usize),
                    None => usize::MAX,
                };
                i += 1;
                continue;
            }
            b'k' | b'K' => 10,
            b'm' | b'M' => 20,
            _ => return None,
        };
        return if i + 1 == word.len() { Some(n.saturating_mul(1 << shift)) } else { None };
    }
    Some(n)
}

/// The detection `KMEMCG_DEBUG` asks for (none without `std`); with
/// `std`, one warning on standard error if a word of it was not
/// understood (by the caller that swaps `warned` from 0).
pub(super) fn env_detection(warned: &AtomicUsize) -> Detection {
    #[cfg(all(feature = "std", not(loom)))]
    {
        // SAFETY: a NUL-terminated name; `getenv` neither allocates nor
        // locks, and what it returns is read before anything can change
        // the environment of a program that is only starting to allocate.
        let v = unsafe {
            let v = libc::getenv(c"KMEMCG_DEBUG".as_ptr());
            if v.is_null() {
                return Detection::OFF;
            }
            core::ffi::CStr::from_ptr(v).to_bytes()
        };
        let (d, unknown) = parse(v);
        if let Some((a, b)) = unknown
            // Relaxed: the flag guards nothing but the warning itself.
            && warned.swap(1, Ordering::Relaxed) == 0
        {
            let word = core::str::from_utf8(&v[a..b]).unwrap_or("(not UTF-8)");
            super::report::warn(format_args!(
                "kmemcg: KMEMCG_DEBUG: unknown word {word:?} skipped (known: 1, true, yes, on, all; 0, false, \
                 no, off; or a list of redzone, poison, quarantine=N[k|m], guard=N, sampled, sites); detection \
                 taken: {d:?}"
            ));
        }
        d
    }
    #[cfg(not(all(feature = "std", not(loom))))]
    {
        let _ = warned;
        Detection::OFF
    }
}
