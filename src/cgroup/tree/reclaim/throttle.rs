//! The `high` throttle: reclaim from a group above its `high`, then a
//! delay in proportion to the excess left.

use lock_api::RawMutex;

use super::super::Tree;
use super::reclaiming;
use crate::cgroup::{Event, Group};
use crate::magazine::Env;
use crate::platform::Platform;
use crate::sync::Ordering;

/// The `high` throttle: the delay for [`HIGH_DELAY_BATCH`] pages charged
/// while the group stays above its `high`, after reclaim, by as much as
/// the `high` itself (at twice its `high`); in proportion to both the
/// pages and the excess (Linux scales its delay by the pages charged over
/// `high` too).
pub const HIGH_DELAY_NS: u64 = 20_000_000;

/// Pages charged per [`HIGH_DELAY_NS`] (Linux's `MEMCG_CHARGE_BATCH`).
pub const HIGH_DELAY_BATCH: usize = 64;

/// The longest `high` throttle delay of one allocation.
pub const HIGH_DELAY_MAX_NS: u64 = 100_000_000;

/// Delays shorter than this are not made (a sleep would cost about as
/// much as it holds back).
pub const HIGH_DELAY_MIN_NS: u64 = 50_000;

/// The throttle delay for `pages` charged while `excess` pages above a
/// `high` of `high` pages are left: [`HIGH_DELAY_NS`] per
/// [`HIGH_DELAY_BATCH`] pages and per `high` of excess, at most
/// [`HIGH_DELAY_MAX_NS`], none under [`HIGH_DELAY_MIN_NS`].
pub(crate) fn delay(excess: usize, high: usize, pages: usize) -> u64 {
    let scale = high.max(1) as u128 * HIGH_DELAY_BATCH as u128;
    let ns = (excess as u128).saturating_mul(pages as u128).saturating_mul(HIGH_DELAY_NS as u128) / scale;
    let ns = ns.min(HIGH_DELAY_MAX_NS as u128) as u64;
    if ns < HIGH_DELAY_MIN_NS { 0 } else { ns }
}

impl<R: RawMutex> Tree<R> {
    /// After a charge to `g` (a magazine refill, a large object): an
    /// allocating task whose group (or an ancestor) is above `high`
    /// reclaims from that level before its allocation returns (it never
    /// fails for `high`); if a level stays above its `high`, the task is
    /// then delayed in proportion to the excess left and to the pages the
    /// level was charged above its `high` since its last delay ([`delay`];
    /// the largest of the levels'), through [`Platform::throttle`], and
    /// the level counts it. Never in atomic context (interrupts, atomic
    /// scopes, shrinkers, the event hook), where there was no reclaim
    /// either.
    pub(crate) fn over_high<E: Env<R>>(&self, env: &E, g: &Group<R>) {
        let mut worst: Option<(&Group<R>, u64)> = None;
        let mut level = Some(g);
        while let Some(l) = level {
            let high = l.counter.high();
            if l.counter.usage() > high {
                self.event(env, l, Event::High);
                let excess = l.counter.usage().saturating_sub(high);
                self.reclaim(env, l, Self::reclaim_goal(l, excess));
                let usage = l.counter.usage();
                if usage > high && !reclaiming(env) {
                    // Pages charged above `high` since the last delay.
                    let last = l.high_mark.swap(usage, Ordering::Relaxed);
                    let ns = delay(usage - high, high, usage.saturating_sub(last.max(high)));
                    if ns > worst.map_or(0, |(_, w)| w) {
                        worst = Some((l, ns));
                    }
                }
            }
            level = l.parent();
        }
        if let Some((l, ns)) = worst {
            l.events.throttled.add(1);
            l.events.throttled_us.add((ns / 1000) as usize);
            env.plat().throttle(ns);
        }
    }
}
