#!/usr/bin/env bash
# Builds kernel-demo, boots it under QEMU and checks its self-test.
#
#   bash kernel-demo/run-qemu.sh [x86_64|aarch64] [icount|heap=KIB|numa|numa-icount]   (default: x86_64)
#
# x86_64: boots the Multiboot kernel with `qemu-system-x86_64 -smp 4`
# (TCG), and exits 0 only if QEMU exits with the success status (33, from
# isa-debug-exit) and the serial output holds the PASS line.
# aarch64: runs kernel-demo/aarch64/run-qemu.sh (with the mode, if given).
#
# icount: instead of the self-test, boots on one CPU under `-icount
# shift=0,sleep=off` with `icount` on the kernel command line: the kernel
# prints its guest instructions per 64-byte alloc+free pair (`icount: ...`
# lines, see kernel-demo/src/kernel/icount.rs) and `icount: done`, which
# stands in for the PASS line. scripts/kernel-icount.sh reads them.
# sleep=off: the virtual clock jumps over idle time instead of following
# the host's, so every boot runs the same instructions (with sleep=on, the
# default, main's PerCpu count on aarch64 moved between 250.04 and 250.05).
#
# heap=KIB (e.g. heap=100, heap=64): instead of the self-test, boots on
# one CPU with `heap=KIB` on the kernel command line: the kernel heap gets
# only KIB KiB of RAM and runs a tutorial kernel's heap tests over it
# (kernel-demo/common/src/tutorial_heap.rs), ending with `kmemcg heap suite in
# KIB KiB: PASS`, which stands in for the PASS line.
#
# numa: instead of the self-test, boots on four CPUs and two NUMA nodes
# (`-numa`: CPUs 0-1 and the first 128 MiB on node 0, CPUs 2-3 and the
# other 128 MiB on node 1; the kernel reads them from the ACPI SRAT) with
# `numa` on the kernel command line, and runs the two-node test of
# kernel-demo/common/src/numa.rs, ending with one `node N: ...` line per node
# and `kmemcg numa self-test: PASS`, which stands in for the PASS line.
# numa-icount: the same machine under `-icount shift=0,sleep=off` with
# `numa icount`: CPU 0 prints its guest instructions per local
# allocation, local free and remote free (`numa-icount: ...` lines) and
# `numa-icount: done`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

arch="${1:-x86_64}"
mode="${2:-}"
usage="usage: $0 [x86_64|aarch64] [icount|heap=KIB|numa|numa-icount]"
if ! [[ "$mode" =~ ^(icount|heap=[1-9][0-9]*|numa|numa-icount)?$ ]]; then
  echo "$usage" >&2
  exit 2
fi
case "$arch" in
  x86_64) ;;
  aarch64)
    if [ ! -f kernel-demo/aarch64/run-qemu.sh ]; then
      echo "run-qemu.sh: kernel-demo/aarch64/run-qemu.sh does not exist (no aarch64 demo yet)" >&2
      exit 1
    fi
    exec bash kernel-demo/aarch64/run-qemu.sh ${mode:+"$mode"}
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac

target=x86_64-unknown-none
elf="target/kernel/$target/release/kernel-demo"
image="target/kernel/kernel-demo.elf32"
pass_line="kmemcg kernel self-test: PASS"
cpus=4
limit=120
extra=()
case "$mode" in
  icount)
    pass_line="icount: done"
    cpus=1
    extra=(-icount shift=0,sleep=off -append icount)
    ;;
  heap=*)
    pass_line="kmemcg heap suite in ${mode#heap=} KiB: PASS"
    cpus=1
    extra=(-append "$mode")
    ;;
  numa | numa-icount)
    pass_line="kmemcg numa self-test: PASS"
    extra=(-object memory-backend-ram,id=m0,size=128M -object memory-backend-ram,id=m1,size=128M
      -numa node,nodeid=0,cpus=0-1,memdev=m0 -numa node,nodeid=1,cpus=2-3,memdev=m1)
    if [ "$mode" = numa-icount ]; then
      pass_line="numa-icount: done"
      extra+=(-icount shift=0,sleep=off -append "numa icount")
    else
      extra+=(-append numa)
    fi
    ;;
esac

. kernel-demo/setup.sh
need qemu-system-x86_64 qemu-system-x86
need objcopy binutils
need_target "$target"

start=$(date +%s)
cargo build -p kernel-demo --release --target "$target" --target-dir target/kernel
# QEMU's multiboot loader refuses ELF64: repackage as ELF32 (same bytes,
# addresses all below 4 GiB).
objcopy -I elf64-x86-64 -O elf32-i386 "$elf" "$image"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
timeout "$limit" qemu-system-x86_64 -accel tcg -smp "$cpus" -kernel "$image" -serial stdio -display none \
  -no-reboot -device isa-debug-exit,iobase=0xf4,iosize=0x04 -m 256M "${extra[@]}" </dev/null >"$log" || status=$?
cat "$log"
echo "run-qemu.sh: QEMU exit status $status (33 = pass), $(($(date +%s) - start)) s build + boot"

if [ "$status" -eq 33 ] && grep -qxF "$pass_line" "$log"; then
  exit 0
fi
[ "$status" -eq 124 ] && echo "run-qemu.sh: timed out after $limit s" >&2
grep -qxF "$pass_line" "$log" || echo "run-qemu.sh: no '$pass_line' line in the serial output" >&2
exit 1
