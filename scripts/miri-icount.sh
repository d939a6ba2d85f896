#!/usr/bin/env bash
# What a user's small test suite under Miri (tests/miri_suite.rs) costs,
# deterministically: instructions the Miri interpreter executes
# (valgrind --tool=callgrind on the miri driver), with kmemcg as the
# global allocator and with std::alloc::System, and their ratio. Wall
# time (scripts/miri-suite.sh) moves by 2x with the machine's load; these
# counts move by well under 1% between runs, so they show what a change
# does to Miri runs. Compare runs from the same checkout path and target
# directory only: the lengths of the paths the test harness parses change
# its own allocations, and kmemcg's count with them (by up to 20% for
# the harness alone).
#
#   bash scripts/miri-icount.sh [stacked|tree] [test filter]
#
# The tree model takes about 10 minutes on the development machine. Needs
# valgrind and the nightly miri component. Valgrind 3.19 cannot read the
# miri driver's DWARF 5, so a copy without debug information is run.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-tree}
filter=${2:-}
flags="-Zmiri-strict-provenance -Zmiri-ignore-leaks"
[[ "$model" == tree ]] && flags="$flags -Zmiri-tree-borrows"
export MIRIFLAGS="$flags"

sysroot=$(rustc +nightly --print sysroot)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
objcopy --strip-debug "$sysroot/bin/miri" "$work/miri"
cat > "$work/wrap.sh" <<EOF
#!/usr/bin/env bash
# cargo-miri asks the driver for its version first: not counted.
if [[ -n "\${MIRI_BE_RUSTC:-}" ]]; then exec "$sysroot/bin/miri" "\$@"; fi
export LD_LIBRARY_PATH="$sysroot/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec valgrind --tool=callgrind --callgrind-out-file=/dev/null "$work/miri" "\$@"
EOF
chmod +x "$work/wrap.sh"

declare -A count=()
for alloc in kmemcg system; do
  if [[ "$alloc" == system ]]; then export MIRI_SUITE_SYSTEM=1; else unset MIRI_SUITE_SYSTEM; fi
  cargo +nightly miri test -q --test miri_suite --target-dir target/miri --no-run 2>/dev/null
  count[$alloc]=$(MIRI="$work/wrap.sh" cargo +nightly miri test -q --test miri_suite \
    --target-dir target/miri -- $filter 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
done
unset MIRI_SUITE_SYSTEM
echo "miri-icount ($model borrows): kmemcg ${count[kmemcg]}, System ${count[system]} instructions," \
  "ratio $(python3 -c "print(f'{${count[kmemcg]} / ${count[system]}:.2f}')")"
