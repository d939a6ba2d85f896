#!/usr/bin/env bash
# What sampling alone (issue 30, item 3) costs against detection off, in
# time: `random` and 64-byte pairs (examples/detect_cost, `random-only` /
# `pair-only`) and the real program (scripts/realprog), each mode in its
# own process, off and sampled alternating (which first swaps each
# round), ROUNDS rounds (default 21).
# Prints per workload the medians, the ratio of the medians and the median
# of the per-round ratios (rounds are adjacent in time, so the load they
# saw is alike). Time on a shared machine moves by more than the effect:
# read it beside the instruction counts (BENCHMARKS.md, "Detection").
#
#   scripts/sampled-cost.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-${ROUNDS:-21}}
cargo build --release --example detect_cost --quiet
(cd scripts/realprog && cargo build --release --quiet)
dc="${CARGO_TARGET_DIR:-target}/release/examples/detect_cost"
rp=scripts/realprog/target/release/realprog_kmemcg
out=$(mktemp)
for r in $(seq "$rounds"); do
  # Which mode goes first swaps every round, so neither gains from order.
  order=$([[ $((r % 2)) == 1 ]] && echo "off sampled" || echo "sampled off")
  for m in $order; do
    echo "random $m $("$dc" random-only "$m" 10000000 | awk '{print $5}')" >>"$out"
    echo "pair $m $("$dc" pair-only "$m" 20000000 | awk '{print $5}')" >>"$out"
    d=$([[ $m == off ]] && echo 0 || echo sampled)
    echo "realprog $m $(RAYON_NUM_THREADS=1 KMEMCG_DEBUG=$d "$rp" 200000 | awk '{print $3}')" >>"$out"
  done
done
python3 - "$out" "$rounds" <<'PY'
import statistics as st, sys
d = {}
for line in open(sys.argv[1]):
    w, m, v = line.split()
    d.setdefault(w, {}).setdefault(m, []).append(float(v))
print(f"sampling alone / off, {sys.argv[2]} alternating rounds, each in its own process")
print(f"{'workload':10} {'off (median)':>14} {'sampled':>10} {'ratio of medians':>17} {'median of ratios':>17}")
for w, ms in d.items():
    a, b = ms["off"], ms["sampled"]
    per = st.median(y / x for x, y in zip(a, b))
    unit = "s" if w == "realprog" else "ns"
    print(f"{w:10} {st.median(a):11.4f} {unit:2} {st.median(b):10.4f} {st.median(b) / st.median(a):17.4f} {per:17.4f}")
PY
rm -f "$out"
