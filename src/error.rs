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
    /// A live cache already has this name.
    NameTaken,
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
            Error::NameTaken => f.write_str("a live cache already has this name"),
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
    /// Checks and copies `s`.
    pub(crate) fn new(s: &str) -> Result<Name, Error> {
        if s.is_empty() {
            return Err(Error::NameEmpty);
        }
        if s.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        let mut bytes = [0; NAME_MAX];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Ok(Name { bytes, len: s.len() as u8 })
    }

    /// The name as text.
    pub(crate) fn as_str(&self) -> &str {
        // Built from a whole `&str`, so this is valid UTF-8.
        core::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("?")
    }
}
