//! Tests of the whole crate: the group API, pressure resources and reclaim
//! through the public handles, and (`--cfg loom`) loom models of the
//! concurrent protocols.
//!
//! Run the loom models with:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --lib loom`

/// Implements the magazine layer's `Env` for a loom model's environment
/// `$env` (fields `src: Region<LoomRawMutex, 2>`, `plat: $plat`, `slots`,
/// `mags`), whose root counter is `$root` of `$s`.
#[cfg(loom)]
macro_rules! model_env {
    ($env:ty, $plat:ty, |$s:ident| $root:expr) => {
        impl crate::magazine::Env<crate::sync::LoomRawMutex> for $env {
            type Src = crate::platform::Region<crate::sync::LoomRawMutex, 2>;
            type Plat = $plat;
            fn src(&self) -> &Self::Src {
                &self.src
            }
            fn plat(&self) -> &$plat {
                &self.plat
            }
            fn slots(&self) -> &crate::magazine::Slots {
                &self.slots
            }
            fn mags(&self) -> &crate::slab::Cache<crate::sync::LoomRawMutex> {
                &self.mags
            }
            fn root_counter(&self) -> &crate::counter::PageCounter {
                let $s = self;
                $root
            }
        }
    };
}

#[cfg(not(loom))]
mod events;
#[cfg(not(loom))]
mod groups;
#[cfg(not(loom))]
mod guards;
#[cfg(not(loom))]
mod heap;
#[cfg(loom)]
mod loom_counter;
#[cfg(loom)]
mod loom_magazine;
#[cfg(all(loom, feature = "std"))]
mod loom_revoke;
#[cfg(loom)]
mod loom_tree;
#[cfg(not(loom))]
mod pressure;
#[cfg(not(loom))]
mod protection;
#[cfg(not(loom))]
mod reclaim;
#[cfg(not(loom))]
mod removal;
#[cfg(not(loom))]
mod throttle;
#[cfg(not(loom))]
mod typed;
