#!/usr/bin/env bash
# Detection against AddressSanitizer, side by side (issue 30): the same two
# workloads of `examples/detect_cost.rs` (64-byte pairs, `random`), once in
# a normal release build (System, kmemcg with detection off / sampled /
# on / all) and once built with `-Zsanitizer=address` on nightly, where
# `System` is ASan's allocator with every access of the workload checked.
# Prints each one's ratio to plain System and kmemcg's full detection as a
# share of ASan's ratio (the issue's goal: at most 0.5x). Times are
# medians of 7 rounds; the machine is shared, so read them as such.
#
#   bash scripts/detect-vs-asan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')

cargo build -q --release --example detect_cost
RUSTFLAGS="-Zsanitizer=address" cargo +nightly build -q --release --example detect_cost \
  --target "$host" --target-dir target/asan

plain=$(./target/release/examples/detect_cost)
echo "$plain"
asan=$(ASAN_OPTIONS=detect_leaks=0 "target/asan/$host/release/examples/detect_cost" system-only)
echo "ASan build: $asan"

python3 - "$plain" "$asan" <<'EOF'
import sys
plain, asan = sys.argv[1], sys.argv[2]
rows = {}
for line in plain.splitlines()[1:]:
    cols = line.split()
    # name (may hold spaces), pair ns, /off, /System, random ns, /off, /System
    name = " ".join(cols[:-6])
    rows[name] = (float(cols[-6]), float(cols[-3]))
sys_pair, sys_random = rows["System"]
a = asan.split()
asan_pair, asan_random = float(a[3]), float(a[6])
print()
print("                     pair-64 /System   random /System")
print(f"ASan (System)        {asan_pair / sys_pair:>15.2f}   {asan_random / sys_random:>14.2f}")
for name in ("sampled (1/5000)", "on, no sampling", "all (guard 1/256)"):
    p, r = rows[name]
    print(f"kmemcg {name:<13} {p / sys_pair:>15.2f}   {r / sys_random:>14.2f}")
p, r = rows["on, no sampling"]
print()
print(
    "full detection's ratio as a share of ASan's: "
    f"pairs {(p / sys_pair) / (asan_pair / sys_pair):.2f}x, random {(r / sys_random) / (asan_random / sys_random):.2f}x"
)
EOF
