#!/usr/bin/env bash
# Builds kernel-demo-aarch64, boots it on 4 CPUs under qemu-system-aarch64
# (-M virt), and checks its self-test. Exits 0 only if QEMU exits with
# status 0 (semihosting SYS_EXIT, ADP_Stopped_ApplicationExit, status 0)
# and the serial output holds the PASS line.
#
#   bash kernel-demo/aarch64/run-qemu.sh [icount|heap=KIB|numa|numa-icount]
#
# icount: instead of the self-test, boots on one CPU under `-icount
# shift=0,sleep=off` with `icount` in the kernel command line (`-append`,
# the device tree's bootargs): the kernel prints its guest instructions
# per 64-byte alloc+free pair (`icount: ...` lines, see
# src/kernel/icount.rs) and `icount: done`, which stands in for the PASS
# line. sleep=off: every boot runs the same instructions (see
# kernel-demo/run-qemu.sh).
#
# heap=KIB (e.g. heap=100, heap=64): instead of the self-test, boots on
# one CPU with `heap=KIB` in the kernel command line: the kernel heap gets
# only KIB KiB of RAM and runs a tutorial kernel's heap tests over it
# (kernel-demo/common/src/tutorial_heap.rs), ending with `kmemcg heap suite in
# KIB KiB: PASS`, which stands in for the PASS line.
#
# numa: instead of the self-test, boots on four CPUs and two NUMA nodes
# (`-numa`: CPUs 0-1 and the first 128 MiB on node 0, CPUs 2-3 and the
# other 128 MiB on node 1; QEMU writes `numa-node-id` into the device
# tree's CPU and memory nodes) with `numa` in the kernel command line,
# and runs the two-node test of kernel-demo/common/src/numa.rs, ending with
# one `node N: ...` line per node and `kmemcg numa self-test: PASS`,
# which stands in for the PASS line. numa-icount: the same machine under
# `-icount shift=0,sleep=off` with `numa icount`: CPU 0 prints its guest
# instructions per local allocation, local free and remote free
# (`numa-icount: ...` lines) and `numa-icount: done`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

target=aarch64-unknown-none
elf="target/kernel-aarch64/$target/release/kernel-demo-aarch64"
image="target/kernel-aarch64/kernel-demo-aarch64.Image"
pass_line="kmemcg kernel self-test: PASS"
timeout_s=${KERNEL_DEMO_TIMEOUT:-120}
cpus=4
extra=()
case "${1:-}" in
  "") ;;
  icount)
    pass_line="icount: done"
    cpus=1
    extra=(-icount shift=0,sleep=off -append icount)
    ;;
  heap=[1-9]*)
    if ! [[ "$1" =~ ^heap=[1-9][0-9]*$ ]]; then
      echo "usage: $0 [icount|heap=KIB|numa|numa-icount]" >&2
      exit 2
    fi
    pass_line="kmemcg heap suite in ${1#heap=} KiB: PASS"
    cpus=1
    extra=(-append "$1")
    ;;
  numa | numa-icount)
    pass_line="kmemcg numa self-test: PASS"
    extra=(-object memory-backend-ram,id=m0,size=128M -object memory-backend-ram,id=m1,size=128M
      -numa node,nodeid=0,cpus=0-1,memdev=m0 -numa node,nodeid=1,cpus=2-3,memdev=m1)
    if [ "$1" = numa-icount ]; then
      pass_line="numa-icount: done"
      extra+=(-icount shift=0,sleep=off -append "numa icount")
    else
      extra+=(-append numa)
    fi
    ;;
  *)
    echo "usage: $0 [icount|heap=KIB|numa|numa-icount]" >&2
    exit 2
    ;;
esac

. kernel-demo/setup.sh
need qemu-system-aarch64 qemu-system-arm
need_target "$target"

# An objcopy that reads aarch64 ELF: LLVM's, the one rustc ships, or GNU
# binutils' generic ELF reader.
objcopy_bin() {
  local sysroot_objcopy
  sysroot_objcopy="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/rust-objcopy"
  if command -v llvm-objcopy >/dev/null; then
    llvm-objcopy -O binary "$1" "$2"
  elif [ -x "$sysroot_objcopy" ]; then
    "$sysroot_objcopy" -O binary "$1" "$2"
  else
    need objcopy binutils
    objcopy -I elf64-little -O binary "$1" "$2"
  fi
}

start=$(date +%s)
cargo build -p kernel-demo-aarch64 --release --target "$target" --target-dir target/kernel-aarch64
# A raw binary with the arm64 Image header at its start: QEMU loads it at
# RAM base + text_offset and passes the device tree in x0 (an ELF would be
# started with no device tree address).
objcopy_bin "$elf" "$image"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
timeout "$timeout_s" qemu-system-aarch64 -M virt -cpu cortex-a57 -smp "$cpus" -m 256M \
  -nographic -semihosting -no-reboot -kernel "$image" "${extra[@]}" </dev/null >"$log" 2>&1 || status=$?
cat "$log"
echo "run-qemu.sh: QEMU exit status $status (0 = pass), $(($(date +%s) - start)) s build + boot"

if [ "$status" -eq 0 ] && grep -qxF "$pass_line" <(tr -d '\r' <"$log"); then
  exit 0
fi
[ "$status" -eq 124 ] && echo "run-qemu.sh: timed out after $timeout_s s" >&2
grep -qxF "$pass_line" <(tr -d '\r' <"$log") || echo "run-qemu.sh: no '$pass_line' line in the serial output" >&2
exit 1
