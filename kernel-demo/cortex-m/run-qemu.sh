#!/usr/bin/env bash
# Builds kernel-demo-cortex-m and runs it under qemu-system-arm on the
# MPS2 AN386 board (Cortex-M4). Exits 0 only if QEMU exits with status 0
# (semihosting SYS_EXIT_EXTENDED, status 0) and the output holds the PASS
# line.
#
#   bash kernel-demo/cortex-m/run-qemu.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

target=thumbv7em-none-eabihf
elf="target/kernel-cortex-m/$target/release/kernel-demo-cortex-m"
pass_line="kmemcg cortex-m demo: PASS"
timeout_s=${KERNEL_DEMO_TIMEOUT:-60}

. kernel-demo/setup.sh
need qemu-system-arm qemu-system-arm
need_target "$target"

start=$(date +%s)
cargo build -p kernel-demo-cortex-m --release --target "$target" --target-dir target/kernel-cortex-m

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# The ELF as is: QEMU loads its segments (.data at its load address in
# SSRAM1, where the reset handler copies it from) and starts the core
# from the vector table at 0. Output and exit go through semihosting; no
# UART is used.
timeout "$timeout_s" qemu-system-arm -M mps2-an386 -nographic -monitor none -serial none \
  -semihosting-config enable=on,target=native -no-reboot -kernel "$elf" </dev/null >"$log" 2>&1 || status=$?
cat "$log"
echo "run-qemu.sh: QEMU exit status $status (0 = pass), $(($(date +%s) - start)) s build + run"

if [ "$status" -eq 0 ] && grep -qxF "$pass_line" <(tr -d '\r' <"$log"); then
  exit 0
fi
[ "$status" -eq 124 ] && echo "run-qemu.sh: timed out after $timeout_s s" >&2
grep -qxF "$pass_line" <(tr -d '\r' <"$log") || echo "run-qemu.sh: no '$pass_line' line in the output" >&2
exit 1
