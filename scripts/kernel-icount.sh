#!/usr/bin/env bash
# Guest instructions per 64-byte alloc+free pair in the kernel demos, on
# one CPU, with the per-CPU platform (`PerCpu`, the kernel heap) and the
# single-context one (`NoCpus`, the comparison heap): each kernel boots
# under QEMU `-icount shift=0` (`bash kernel-demo/run-qemu.sh ARCH icount`)
# and prints its counts, which are checked against
# .ci/kernel-icount-budget. Under -icount the counts are exact and the
# same on every boot (see kernel-demo/src/kernel/icount.rs and
# kernel-demo/aarch64/src/kernel/icount.rs).
#
#   scripts/kernel-icount.sh [--print] [--runs N] [--numa]
#
#   --print   print the counts only, check nothing
#   --runs N  boot each kernel N times (default 1) and fail unless every
#             boot gives the same counts
#   --numa    instead, boot each kernel on two NUMA nodes
#             (`run-qemu.sh ARCH numa-icount`) and print its counts per
#             local allocation, local free and remote free, and per pair,
#             on the two-node heap and on the one-node global heap
#             (BENCHMARKS.md, "Two NUMA nodes"); checks no budget
#
# A change that exceeds a budget raises it in .ci/kernel-icount-budget in
# the same commit, and says why.
set -euo pipefail
cd "$(dirname "$0")/.."

print_only=
runs=1
mode=icount
prefix=icount
while [ $# -gt 0 ]; do
  case "$1" in
    --print) print_only=1 ;;
    --numa)
      mode=numa-icount
      prefix=numa-icount
      print_only=1
      ;;
    --runs)
      runs=${2:-}
      shift
      ;;
    *)
      echo "usage: $0 [--print] [--runs N] [--numa]" >&2
      exit 2
      ;;
  esac
  shift
done
if ! [[ "$runs" =~ ^[1-9][0-9]*$ ]]; then
  echo "kernel-icount.sh: --runs wants a positive number" >&2
  exit 2
fi

budget_file=.ci/kernel-icount-budget
start=$(date +%s)
status=0
checked=0
for arch in x86_64 aarch64; do
  first=
  for run in $(seq "$runs"); do
    log=$(bash kernel-demo/run-qemu.sh "$arch" "$mode" 2>&1 | tr -d '\r') || {
      echo "$log"
      echo "kernel-icount.sh: the $arch $mode boot failed" >&2
      exit 1
    }
    counts=$(grep -E "^$prefix: " <<<"$log" | grep -v "^$prefix: done\$")
    if [ -z "$first" ]; then
      first=$counts
      echo "$arch:"
      sed 's/^/  /' <<<"$counts"
    elif [ "$counts" != "$first" ]; then
      echo "kernel-icount.sh: $arch boot $run gave other counts than boot 1:" >&2
      sed 's/^/  /' <<<"$counts" >&2
      exit 1
    fi
  done
  [ "$runs" -gt 1 ] && echo "  (the same on $runs boots)"
  [ -n "$print_only" ] && continue
  for case in percpu nocpus; do
    per=$(sed -n "s/^icount: $case \([0-9.]*\) instructions per .*/\1/p" <<<"$first")
    budget=$(awk -v a="$arch" -v c="$case" '$1 == a && $2 == c { print $3 }' "$budget_file")
    if [ -z "$per" ]; then
      echo "kernel-icount.sh: the $arch kernel printed no $case count" >&2
      status=1
      continue
    fi
    if [ -z "$budget" ]; then
      echo "kernel-icount.sh: no $arch $case budget in $budget_file" >&2
      status=1
      continue
    fi
    checked=$((checked + 1))
    if python3 -c "import sys; sys.exit(0 if $per <= $budget else 1)"; then
      printf '%-8s %-7s %8s <= %s  ok\n' "$arch" "$case" "$per" "$budget"
    else
      printf '%-8s %-7s %8s >  %s  OVER BUDGET\n' "$arch" "$case" "$per" "$budget"
      status=1
    fi
  done
done
rows=$(grep -cvE '^[[:space:]]*(#|$)' "$budget_file")
if [ -z "$print_only" ] && [ "$rows" -ne "$checked" ]; then
  echo "kernel-icount.sh: $budget_file has $rows budgets, $checked were checked" >&2
  status=1
fi
echo "kernel-icount.sh: $(($(date +%s) - start)) s"
exit $status
