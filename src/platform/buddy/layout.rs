//! Where a zone's metadata goes: inline in the `Region`, or in the zone's
//! own first pages, and how many pages that leaves.

use crate::platform::PAGE_SIZE;

/// Where a zone's meta array goes (see [`Buddy::add_zone`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MetaAt {
    /// At this address, in the bytes before the first whole page or after
    /// the last.
    Bytes(usize),
    /// In the buddy's `inline` bytes.
    Inline,
    /// In whole pages of the zone.
    Pages,
}

/// Where the pages and the meta array of a zone built from `[start, start
/// + len)` go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ZoneLayout {
    /// The whole pages of the memory, `[lo, hi)`.
    pub(super) lo: usize,
    pub(super) hi: usize,
    /// Usable pages: those whole pages less the meta pages.
    pub(super) pages: usize,
    pub(super) meta: MetaAt,
}

impl ZoneLayout {
    /// The layout of a zone over `[start, start + len)` in a buddy with
    /// `inline_room` inline meta bytes left; `None` if that holds no whole
    /// page or overflows.
    pub(super) fn of(start: usize, len: usize, island: bool, inline_room: usize) -> Option<ZoneLayout> {
        let lo = start.checked_add(PAGE_SIZE - 1)? & !(PAGE_SIZE - 1);
        let end = start.checked_add(len)?;
        let hi = end & !(PAGE_SIZE - 1);
        if hi <= lo {
            return None;
        }
        let total = (hi - lo) / PAGE_SIZE;
        let whole = |meta| Some(ZoneLayout { lo, hi, pages: total, meta });
        if !island && total <= lo - start {
            return whole(MetaAt::Bytes(start));
        }
        if !island && total <= end - hi {
            return whole(MetaAt::Bytes(hi));
        }
        if total <= inline_room {
            return whole(MetaAt::Inline);
        }
        let meta_pages = total.div_ceil(PAGE_SIZE);
        Some(ZoneLayout { lo, hi, pages: total.saturating_sub(meta_pages), meta: MetaAt::Pages })
    }

    /// The bytes the zone takes: its whole pages, and its meta array if
    /// that lies outside them.
    pub(super) fn raw(&self) -> (usize, usize) {
        match self.meta {
            MetaAt::Bytes(at) => (self.lo.min(at), self.hi.max(at + self.pages)),
            MetaAt::Inline | MetaAt::Pages => (self.lo, self.hi),
        }
    }
}
