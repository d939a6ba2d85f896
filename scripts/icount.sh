#!/usr/bin/env bash
# Instructions per operation of the loops in examples/icount.rs, from
# callgrind runs at N and 2N operations ((2N - N) / N, so start-up
# cancels), checked against .ci/icount-budget. Counts are deterministic
# for a binary: they do not move with the machine's load.
#
#   scripts/icount.sh          check every case against its budget
#   scripts/icount.sh --print  print the counts only
#
# A change that exceeds a budget raises it in .ci/icount-budget in the
# same commit, and says why.
set -euo pipefail
cd "$(dirname "$0")/.."
print_only=${1:-}
n=200000
cargo build --release --example icount --quiet
bin="${CARGO_TARGET_DIR:-target}/release/examples/icount"
count() { # case ops -> total instructions
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
status=0
while read -r case budget; do
  [[ -z "$case" || "$case" == \#* ]] && continue
  a=$(count "$case" "$n")
  b=$(count "$case" $((2 * n)))
  per=$(python3 -c "print(f'{($b - $a) / $n:.2f}')")
  if [[ "$print_only" == --print ]]; then
    printf '%-12s %8s instructions per operation\n' "$case" "$per"
  elif python3 -c "import sys; sys.exit(0 if $per <= $budget else 1)"; then
    printf '%-12s %8s <= %s  ok\n' "$case" "$per" "$budget"
  else
    printf '%-12s %8s >  %s  OVER BUDGET\n' "$case" "$per" "$budget"
    status=1
  fi
done < .ci/icount-budget
exit $status
