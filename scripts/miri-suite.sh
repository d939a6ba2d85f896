#!/usr/bin/env bash
# A user's small test suite under Miri (tests/miri_suite.rs) with kmemcg as
# the global allocator and, built with MIRI_SUITE_SYSTEM=1, with
# std::alloc::System, under Stacked and Tree Borrows: prints the time of
# each run (the build is done first and not timed) and kmemcg's ratio to
# System. Timing is reported, not asserted (the machine is shared).
#
#   bash scripts/miri-suite.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for model in stacked tree; do
  flags="-Zmiri-strict-provenance -Zmiri-ignore-leaks"
  [[ "$model" == tree ]] && flags="$flags -Zmiri-tree-borrows"
  declare -A secs=()
  for alloc in kmemcg system; do
    if [[ "$alloc" == system ]]; then export MIRI_SUITE_SYSTEM=1; else unset MIRI_SUITE_SYSTEM; fi
    MIRIFLAGS="$flags" cargo +nightly miri test -q --test miri_suite --target-dir target/miri --no-run 2>/dev/null
    start=$(date +%s.%N)
    MIRIFLAGS="$flags" timeout 900 cargo +nightly miri test -q --test miri_suite --target-dir target/miri
    secs[$alloc]=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
  done
  unset MIRI_SUITE_SYSTEM
  echo "miri-suite ($model borrows): kmemcg ${secs[kmemcg]} s, System ${secs[system]} s," \
    "ratio $(python3 -c "print(f'{${secs[kmemcg]} / ${secs[system]}:.1f}')")"
done
