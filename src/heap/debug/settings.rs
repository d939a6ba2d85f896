//! What detection does ([`Detection`]) and the `KMEMCG_DEBUG` syntax.

#[allow(unused_imports)] // the docs' links
use crate::heap::Kmem;

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
}

impl Detection {
    /// No detection: the plain allocator.
    pub const OFF: Detection = Detection { redzone: false, poison: false, quarantine: 0, guard_every: 0 };
    /// Red zones, poison, a 1 MiB quarantine, and one size-class
    /// allocation in 256 on a guard page.
    pub const ALL: Detection = Detection { redzone: true, poison: true, quarantine: 1 << 20, guard_every: 256 };

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
    /// [`GUARDED_MAX`] sampled objects live at once.
    pub const fn guard_pages(mut self, n: usize) -> Self {
        self.guard_every = n;
        self
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

    /// Whether any check is on.
    pub const fn is_on(&self) -> bool {
        self.redzone || self.poison
    }

    /// Detection from a `KMEMCG_DEBUG` value: empty, `0` or `off`: none;
    /// `1`, `on` or `all`: [`Detection::ALL`]; otherwise a comma-separated
    /// list of `redzone`, `poison`, `quarantine=N` (bytes, with an
    /// optional `k` or `m`) and `guard=N` (one allocation in N). Unknown words are ignored (the allocator
    /// cannot report them); [`Kmem::detection`] tells what was taken.
    pub const fn from_env_value(v: &[u8]) -> Detection {
        match v {
            b"" | b"0" | b"off" => return Detection::OFF,
            b"1" | b"on" | b"all" => return Detection::ALL,
            _ => {}
        }
        let mut d = Detection::OFF;
        let mut i = 0;
        while i < v.len() {
            let mut j = i;
            while j < v.len() && v[j] != b',' {
                j += 1;
            }
            let (word, _) = v.split_at(j);
            let (_, word) = word.split_at(i);
            match word {
                b"redzone" => d.redzone = true,
                b"poison" => d.poison = true,
                _ => {
                    if let Some(n) = parse_number(word, b"quarantine=") {
                        d.quarantine = n;
                    } else if let Some(n) = parse_number(word, b"guard=") {
                        d.guard_every = n;
                    }
                }
            }
            i = j + 1;
        }
        d
    }
}

/// `key` followed by `N[k|m]`, as a number.
const fn parse_number(word: &[u8], key: &[u8]) -> Option<usize> {
    if word.len() <= key.len() {
        return None;
    }
    let mut i = 0;
    while i < key.len() {
        if word[i] != key[i] {
            return None;
        }
        i += 1;
    }
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

/// The detection `KMEMCG_DEBUG` asks for (none without `std`).
pub(super) fn env_detection() -> Detection {
    #[cfg(all(feature = "std", not(loom)))]
    {
        // SAFETY: a NUL-terminated name; `getenv` neither allocates nor
        // locks, and what it returns is read before anything can change
        // the environment of a program that is only starting to allocate.
        unsafe {
            let v = libc::getenv(c"KMEMCG_DEBUG".as_ptr());
            if !v.is_null() {
                return Detection::from_env_value(core::ffi::CStr::from_ptr(v).to_bytes());
            }
        }
    }
    Detection::OFF
}
