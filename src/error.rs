//! The crate's error type (a leaf module: every layer may name it).

use core::fmt;

/// What went wrong, small and `Copy`, as page_counter and lock_api report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The page source has no run of the size needed.
    OutOfMemory,
    /// The object layout cannot be cached: alignment above a page, or an
    /// object larger than the largest slab (1 MiB).
    BadLayout,
    /// A name was empty.
    NameEmpty,
    /// A name was longer than [`NAME_MAX`] bytes.
    NameTooLong,
    /// A name held whitespace or a control character (names are columns
    /// in reports), or a group name held `/` or was `.` or `..` (group
    /// names are path components in reports).
    NameInvalid,
    /// A live cache, or a sibling group, already has this name.
    NameTaken,
    /// A charge would take `group` over its hard limit `max` (bytes), even
    /// after reclaim.
    LimitExceeded {
        /// The group whose limit held (the allocating group or an ancestor).
        group: GroupName,
        /// Its limit, in bytes.
        max: usize,
    },
    /// A new limit is below the group's usage (bytes), even after reclaim.
    LimitBelowUsage {
        /// The usage that stays above the limit, in bytes.
        usage: usize,
    },
    /// The group still has children.
    Busy,
    /// The group has been removed.
    Removed,
    /// The root group cannot be removed or protected (`min`, `low`).
    RootGroup,
    /// Pressure thresholds not ordered `min <= pressure <= max`.
    BadThresholds,
    /// A pressure threshold above an ancestor's `max` for that resource
    /// (bytes).
    AboveParentMax {
        /// The smallest `max` among the ancestors' resources.
        parent_max: usize,
    },
    /// A handle of another allocator was passed (e.g. a group of one
    /// `Kmem` to a typed cache of another).
    ForeignGroup,
    /// An uncharge of more than was charged through the resource (bytes;
    /// its descendants' charges are theirs to give back); nothing was
    /// uncharged.
    UnchargeAboveUsage {
        /// What was charged through the resource itself, in bytes.
        usage: usize,
    },
    /// The group's fault-injection rule failed this allocation
    /// ([`crate::Cgroup::inject_faults`]).
    Injected,
}

/// A group's name, as carried by errors and reports.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct GroupName(pub(crate) Name);

impl GroupName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// The longest cache or group name, in bytes.
pub const NAME_MAX: usize = 32;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OutOfMemory => f.write_str("out of memory: the page source is exhausted"),
            Error::BadLayout => f.write_str("layout not cacheable: aligned above a page or larger than a slab"),
            Error::NameEmpty => f.write_str("name is empty"),
            Error::NameTooLong => write!(f, "name longer than {NAME_MAX} bytes"),
            Error::NameInvalid => {
                f.write_str("name holds whitespace or a control character, or a group name holds '/' or is '.' or '..'")
            }
            Error::NameTaken => f.write_str("a live cache or a sibling group already has this name"),
            Error::LimitExceeded { group, max } => {
                write!(f, "charge refused: group {group} is at its limit of {max} bytes")
            }
            Error::LimitBelowUsage { usage } => {
                write!(f, "limit below the group's usage of {usage} bytes, which reclaim could not lower")
            }
            Error::Busy => f.write_str("the group still has children"),
            Error::Removed => f.write_str("the group has been removed"),
            Error::RootGroup => f.write_str("the root group cannot be removed or protected"),
            Error::BadThresholds => f.write_str("pressure thresholds must satisfy min <= pressure <= max"),
            Error::AboveParentMax { parent_max } => {
                write!(f, "a threshold is above an ancestor's max of {parent_max} bytes")
            }
            Error::ForeignGroup => f.write_str("the group belongs to another allocator"),
            Error::UnchargeAboveUsage { usage } => {
                write!(f, "uncharge of more than the resource's usage of {usage} bytes")
            }
            Error::Injected => f.write_str("failed by the group's fault-injection rule"),
        }
    }
}

impl core::error::Error for Error {}

/// A validated name stored inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Name {
    bytes: [u8; NAME_MAX],
    len: u8,
}

impl Name {
    /// The empty name (placeholder in fixed-size tables).
    pub(crate) const EMPTY: Name = Name { bytes: [0; NAME_MAX], len: 0 };
    /// "?": a name that could not be found.
    pub(crate) const UNKNOWN: Name = match Name::new_const("?") {
        Some(n) => n,
        None => panic!("\"?\" is a valid name"),
    };

    /// The page path's name in reports.
    pub(crate) const LARGE: Name = match Name::new_const("large") {
        Some(n) => n,
        None => panic!("\"large\" is a valid name"),
    };

    /// Checks and copies `s`.
    pub(crate) fn new(s: &str) -> Result<Name, Error> {
        if s.is_empty() {
            return Err(Error::NameEmpty);
        }
        if s.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::NameInvalid);
        }
        let mut bytes = [0; NAME_MAX];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Ok(Name { bytes, len: s.len() as u8 })
    }

    /// Checks and copies `s` as a group name: as [`Name::new`], and not
    /// `.` or `..` and without `/`, so a group path in a report reads
    /// unambiguously.
    pub(crate) fn new_group(s: &str) -> Result<Name, Error> {
        let name = Name::new(s)?;
        if s == "." || s == ".." || s.contains('/') {
            return Err(Error::NameInvalid);
        }
        Ok(name)
    }

    /// `s` as a name, in a `const` context; `None` if empty or too long.
    pub(crate) const fn new_const(s: &str) -> Option<Name> {
        let b = s.as_bytes();
        if b.is_empty() || b.len() > NAME_MAX {
            return None;
        }
        let mut bytes = [0; NAME_MAX];
        let mut i = 0;
        while i < b.len() {
            bytes[i] = b[i];
            i += 1;
        }
        Some(Name { bytes, len: b.len() as u8 })
    }

    /// The name as text.
    pub(crate) fn as_str(&self) -> &str {
        // Built from a whole `&str`, so this is valid UTF-8.
        core::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("?")
    }
}
