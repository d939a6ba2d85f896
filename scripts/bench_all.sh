#!/usr/bin/env bash
# Re-runs, at the current checkout, every measurement whose result appears
# in a BENCHMARKS.md table, one step after another; each step's full
# stdout+stderr goes to target/kmemcg-results/logs/<step>.log
# (`CARGO_TARGET_DIR` instead of `target/` when set, as for the benches'
# CSVs), and one line per step gives its name, wall time and command.
#
#   bash scripts/bench_all.sh                  # every default step, in order
#   bash scripts/bench_all.sh 'alloc|memory'   # only the steps whose name matches
#                                              # (bash regex, unanchored; '^dead$' anchors)
#   bash scripts/bench_all.sh --list           # the steps, their commands and estimates
#
# A failing step does not stop the others; the script exits 1 at the end,
# naming the failed steps. Opt-in steps (marked below) run only when the
# regex names them.
#
# BENCHMARKS.md section -> step(s) that regenerate its table(s)
# ------------------------------------------------------------
# "Allocator workloads against peers"
#     session 3 table ........................ alloc (cargo bench --bench alloc, then
#                                              python3 scripts/bench_table.py)
#     session 2 table ........................ FLAG: a historical run (session 2's
#                                              tree); `alloc` only gives today's numbers
#     alloc.png .............................. plots
#     (prose: callgrind 112.6 / 84.2 per pair) cg_profile_pair (extra, not a table)
# "Memory held" .............................. memory
# "Decay: idle memory goes back by itself" ... decay (+ plots for decay.png)
# "Seed 000: `find /` under kmem limits"
#     walk + allocate, replay only, pair-64 .. accounting (+ plots for accounting.png);
#                                              the seed column is a constant of the bench
# "The same, made real: examples/dentry_cache.rs"
#     (table in a code block) ................ dentry_cache (the seed's rows are constants)
# "Seed 001: frees into dead caches" ......... dead (+ plots for dead.png)
#     (prose: callgrind free_all counts) ..... cg_dead_loop (extra, not a table)
#     (prose: 71c84c9 vs the change, interleaved) FLAG: two commits, not one checkout
# "Seed 002: soft limits under contention" ... soft_limits (+ plots); FLAG: the table is
#                                              from "when it was still a bench"; the
#                                              example prints the same kind of samples
# "Seed 003: TCP_RR with socket-buffer accounting"
#     without / with accounting rows ......... tcp_rr
#     "(an earlier run)", "seed 003 (netperf)" FLAG: an old run and the seed's own
#                                              figures; no command reproduces them
# "Test binaries: debug and release against System"
#     dev/test/release table (21 rounds) ..... debug_cost_21 (the driver now also
#                                              measures dev+o1: one row more)
# "Debug builds after issue 16 item 2"
#     kmemcg opt-level table (callgrind) ..... cg_optlevels: today's column only; FLAG:
#                                              "before (e599bcf)" / "after (9173389)"
#                                              are those commits
#     dev/dev+o1/test/release table (11 rounds) debug_cost_11
#     (prose: pair_loop dev, per pair) ....... cg_pair_loop_dev (opt-in, ~4 min)
#     (prose: dev binaries of two commits) ... FLAG: two commits, not one checkout
# "Slot rotation's fast-path cost (session 4)" no table (its pair_loop count is
#                                              cg_pair_loop's root figure; the
#                                              before/after and the oversubscribed
#                                              test are not re-run)
# "The architecture step (session 5, issue 14)" no table (bullets against e731f2e;
#                                              the pair_loop count is cg_pair_loop)
# "Kernels: the per-CPU platform under QEMU"
#     rows "... at the end" .................. qemu_x86_64, qemu_aarch64 (the `bench:`
#                                              lines of the serial output)
#     rows "helper's last run" ............... FLAG: earlier runs of the same kernels;
#                                              re-running gives new "at the end" rows
# "Detection: free when off, what it costs when on"
#     "Off" (98.05 per pair) ................. cg_pair_loop (root)
#     runs 1-3 table ......................... detect_cost (three runs, as the table)
# "Session 6: the fast paths after detection, injection, decay and protection"
#     tree | root | in a group table ......... cg_pair_loop: today's row only; FLAG:
#                                              the other rows are earlier trees
#     (prose: typed_loop 113.05 / 134.06) .... cg_typed_loop (extra, not a table)
#
# Callgrind counts follow BENCHMARKS.md: two runs, N and 2N operations, and
# (Ir(2N) - Ir(N)) / N instructions per operation, computed here and
# printed as `CALLGRIND ...` lines in the step's log (and repeated at the
# end). The opt-level table is total instructions of the workload (2
# rounds per thread), as BENCHMARKS.md gives it; the dead_loop counts are
# the instructions collected in `free_all` (--toggle-collect).
#
# Expected wall time per step (2-core VM; from BENCHMARKS.md, the files'
# docs and their loop counts; builds warm unless said): see EST below and
# `--list`. Default total about 40-45 min, a third of it `alloc`.
#
# Side effects: the benches and examples write their CSVs under
# target/kmemcg-results/ (as they always do); `plots` redraws the tracked
# docs/plots/*.png; cg_optlevels writes a scratch crate and target dir under
# the target directory; debug_cost uses target/helper-bench, as the
# command in BENCHMARKS.md did; cg_profile_pair builds `profile` with the
# bench profile (fat LTO), which replaces target/release/examples/profile.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

if [[ ${KMEMCG_DEBUG+set} || ${KMEMCG_FOOTPRINT+set} ]]; then
  echo "bench_all: unsetting KMEMCG_DEBUG/KMEMCG_FOOTPRINT (detection would distort every number)" >&2
fi
unset KMEMCG_DEBUG KMEMCG_FOOTPRINT

TARGET_DIR=${CARGO_TARGET_DIR:-target}
[[ $TARGET_DIR == /* ]] || TARGET_DIR=$ROOT/$TARGET_DIR
RESULTS=$TARGET_DIR/kmemcg-results
LOGS=$RESULTS/logs
CG=$RESULTS/callgrind
REL=$TARGET_DIR/release/examples
DBG=$TARGET_DIR/debug/examples

# ---- helpers (run inside the steps) ----

# Prints a command, then runs it.
run() {
  echo "+ $*"
  "$@"
}

# Total Ir of a callgrind output file.
cg_total() {
  awk '/^(summary|totals):/ { print $2; exit }' "$1"
}

# cg_diff LABEL N CMD...: runs CMD under callgrind with every argument `{N}`
# replaced by N, then by 2N; prints (Ir(2N) - Ir(N)) / N per operation.
cg_diff() {
  local label=$1 n=$2
  shift 2
  local counts=() k a out
  for k in 1 2; do
    local args=()
    for a in "$@"; do
      [[ $a == '{N}' ]] && a=$((k * n))
      args+=("$a")
    done
    out=$CG/$label.$((k * n)).out
    run valgrind --tool=callgrind --callgrind-out-file="$out" "${args[@]}"
    counts+=("$(cg_total "$out")")
  done
  awk -v l="$label" -v n="$n" -v a="${counts[0]}" -v b="${counts[1]}" 'BEGIN {
    printf "CALLGRIND %s: Ir(N=%d) %.0f, Ir(2N=%d) %.0f, (Ir(2N) - Ir(N)) / N = %.2f instructions per op\n",
      l, n, a, 2 * n, b, (b - a) / n }'
}

# ---- the steps, in the order they run ----
# step NAME ESTIMATE_SECONDS "COMMAND AS SHOWN" [optin]; the work is in s_NAME.
NAMES=() EST=() CMDS=() OPTIN=()
step() {
  NAMES+=("$1") EST+=("$2") CMDS+=("$3") OPTIN+=("${4:-}")
}

# Builds everything the later steps run, so their wall times are mostly the
# runs (each step still builds what it needs if this one is skipped).
# ~30 s warm; 3-5 min cold (fat-LTO benches, jemalloc and mimalloc C builds).
step build 240 "cargo build --release --examples && cargo build --release -p kmemcg-plots && cargo bench --no-run --bench alloc --bench memory --bench accounting --bench dead --bench tcp_rr"
s_build() {
  run cargo build --release --examples
  run cargo build --release -p kmemcg-plots
  run cargo bench --no-run --bench alloc --bench memory --bench accounting --bench dead --bench tcp_rr
}

# Session 6 table (root, in a group); also "Detection: Off", sessions 4/5's
# 98.05. 4 runs of 1-2M pairs under callgrind: ~30-40 s.
step cg_pair_loop 40 "valgrind --tool=callgrind \$REL/pair_loop {1000000,2000000} [group]"
s_cg_pair_loop() {
  run cargo build --release --example pair_loop
  cg_diff pair_loop-root 1000000 "$REL/pair_loop" '{N}'
  cg_diff pair_loop-group 1000000 "$REL/pair_loop" '{N}' group
}

# Session 6 prose: 113.05 unaccounted, 134.06 accounted in a group. ~30-40 s.
step cg_typed_loop 40 "valgrind --tool=callgrind \$REL/typed_loop [account] {1000000,2000000}"
s_cg_typed_loop() {
  run cargo build --release --example typed_loop
  cg_diff typed_loop-unaccounted 1000000 "$REL/typed_loop" '{N}'
  cg_diff typed_loop-accounted 1000000 "$REL/typed_loop" account '{N}'
}

# Peers section prose: 112.6 per pair for kmemcg, 84.2 for jemalloc, "with
# fat LTO" (the bench profile: fat LTO, one codegen unit). Per-function
# inclusive counts (47 in alloc, 51 in dealloc) from callgrind_annotate of
# both runs. Build 1-2 min (fat LTO), runs ~40 s.
step cg_profile_pair 200 "cargo build --profile bench --example profile; valgrind --tool=callgrind \$REL/profile {kmemcg,jemalloc,mimalloc,system} pair {1000000,2000000}"
s_cg_profile_pair() {
  run cargo build --profile bench --example profile
  local a n
  for a in kmemcg jemalloc mimalloc system; do
    cg_diff "profile-$a-pair" 1000000 "$REL/profile" "$a" pair '{N}'
    for n in 1000000 2000000; do
      echo "--- callgrind_annotate --inclusive=yes profile-$a-pair.$n.out (top 25)"
      callgrind_annotate --inclusive=yes "$CG/profile-$a-pair.$n.out" | head -n 45 || true
    done
  done
}

# Seed 001 prose: instructions in free_all for 1M frees, dead vs alive, 64
# and 1024 B (123.7M vs 122.8M and 169.1M vs 168.5M after issue 20). ~1 min.
step cg_dead_loop 60 "valgrind --tool=callgrind --toggle-collect='*free_all*' \$REL/dead_loop {64,1024} 1000000 {alive,dead}"
s_cg_dead_loop() {
  run cargo build --release --example dead_loop
  local size mode out
  for size in 64 1024; do
    for mode in alive dead; do
      out=$CG/dead_loop-$size-$mode.out
      run valgrind --tool=callgrind --toggle-collect='*free_all*' --callgrind-out-file="$out" \
        "$REL/dead_loop" "$size" 1000000 "$mode"
      awk -v s="$size" -v m="$mode" -v t="$(cg_total "$out")" 'BEGIN {
        printf "CALLGRIND dead_loop %s B %s: %.1fM instructions in free_all for 1M frees (%.2f per free)\n",
          s, m, t / 1e6, t / 1e6 }'
    done
  done
}

# "Debug builds after issue 16 item 2", the kmemcg opt-level table: the
# workload (2 rounds per thread) built as a separate crate that depends on
# kmemcg, kmemcg's opt-level set by [profile.dev.package.kmemcg]; plus
# testbin_system (872M). Totals, not differences. 5 small dev builds
# (~20 s each) and six callgrind runs of 0.9-1.7G instructions on 8
# threads: ~5-8 min.
step cg_optlevels 420 "downstream crate, kmemcg opt-level {0,1,s,2,3}: cargo build; valgrind --tool=callgrind testbin_kmemcg 2 (and testbin_system 2)"
s_cg_optlevels() {
  local base=$TARGET_DIR/bench-all-optlevels
  local dir=$base/downstream bins=$base/bins tdir=$base/target
  mkdir -p "$dir" "$bins"
  cp Cargo.lock "$dir/Cargo.lock"
  local level override out b
  for level in 0 1 s 2 3; do
    case $level in
      0) override="" ;;
      s) override=$'[profile.dev.package.kmemcg]\nopt-level = "s"\n' ;;
      *) override=$'[profile.dev.package.kmemcg]\nopt-level = '"$level"$'\n' ;;
    esac
    # As examples/debug_cost.rs writes its dev+o1 crate.
    cat >"$dir/Cargo.toml" <<EOF
[package]
name = "bench-all-optlevels"
version = "0.0.0"
edition = "2024"
publish = false

[workspace]

[dependencies]
kmemcg = { path = "$ROOT" }

[[bin]]
name = "testbin_system"
path = "$ROOT/examples/testbin_system.rs"

[[bin]]
name = "testbin_kmemcg"
path = "$ROOT/examples/testbin_kmemcg.rs"

$override
EOF
    echo "--- kmemcg opt-level $level: $dir/Cargo.toml"
    cat "$dir/Cargo.toml"
    (cd "$dir" && CARGO_TARGET_DIR=$tdir run cargo build --bin testbin_system --bin testbin_kmemcg)
    for b in testbin_system testbin_kmemcg; do
      cp "$tdir/debug/$b" "$bins/$b-o$level"
    done
  done
  out=$CG/optlevels-testbin_system.out
  run valgrind --tool=callgrind --callgrind-out-file="$out" "$bins/testbin_system-o0" 2
  awk -v t="$(cg_total "$out")" 'BEGIN { printf "CALLGRIND optlevels testbin_system (dev, 2 rounds): %.0fM instructions\n", t / 1e6 }'
  for level in 0 1 s 2 3; do
    out=$CG/optlevels-testbin_kmemcg-o$level.out
    run valgrind --tool=callgrind --callgrind-out-file="$out" "$bins/testbin_kmemcg-o$level" 2
    awk -v l="$level" -v t="$(cg_total "$out")" 'BEGIN {
      printf "CALLGRIND optlevels testbin_kmemcg (dev, kmemcg opt-level %s%s, 2 rounds): %.0fM instructions\n",
        l, (l == "0" ? " = no override" : ""), t / 1e6 }'
  done
}

# Opt-in ("Debug builds" prose): pair_loop built in dev, 2,895 -> 1,979
# instructions per pair. 3M pairs at ~2,000 instructions under callgrind:
# ~3-5 min.
step cg_pair_loop_dev 240 "cargo build --example pair_loop; valgrind --tool=callgrind \$DBG/pair_loop {1000000,2000000}" optin
s_cg_pair_loop_dev() {
  run cargo build --example pair_loop
  cg_diff pair_loop-dev-root 1000000 "$DBG/pair_loop" '{N}'
}

# Seed 002 table: ~40 ms of run (plus the protection round).
step soft_limits 10 "cargo run --release --example soft_limits"
s_soft_limits() { run cargo run --release --example soft_limits; }

# Seed 001 table: 5 sizes x 5 interleaved rounds x alive/dead, 1M objects: ~10-20 s.
step dead 20 "cargo bench --bench dead"
s_dead() { run cargo bench --bench dead; }

# Decay table: three runs, each a 256 MiB burst then a 4 s trickle: ~15-20 s.
step decay 20 "cargo run --release --example decay"
s_decay() { run cargo run --release --example decay; }

# Memory held table (plus the footprint against peers: 5 allocators x 3
# runs of 2M steps in fresh processes): ~30-40 s.
step memory 40 "cargo bench --bench memory"
s_memory() { run cargo bench --bench memory; }

# dentry_cache's table: a warm-up, then up to 5 rounds of 8 passes within
# a 40 s budget ("well under a minute").
step dentry_cache 60 "cargo run --release --example dentry_cache"
s_dentry_cache() { run cargo run --release --example dentry_cache; }

# Seed 000's three tables: 8 modes x 7 interleaved rounds over /usr, then
# pair-64 and the 100 groups: ~1 min.
step accounting 60 "cargo bench --bench accounting"
s_accounting() { run cargo bench --bench accounting; }

# Seed 003 table: 2 s runs alternating, 5 each: ~21 s.
step tcp_rr 25 "cargo bench --bench tcp_rr"
s_tcp_rr() { run cargo bench --bench tcp_rr; }

# Detection table: three runs, each 7 interleaved rounds of the three
# allocators (2M pairs and 500k random steps each): ~12 s a run.
step detect_cost 45 "cargo run --release --example detect_cost (3 runs)"
s_detect_cost() {
  local r
  for r in 1 2 3; do
    echo "=== detect_cost run $r of 3"
    run cargo run --release --example detect_cost
  done
}

# Test binaries table: 21 interleaved rounds of 8 binaries (~2-5 s a
# round) after the dev/dev+o1/test/release builds: ~2-4 min warm.
step debug_cost_21 180 "CARGO_TARGET_DIR=target/helper-bench cargo run --release --example debug_cost 21"
s_debug_cost_21() { CARGO_TARGET_DIR=$TARGET_DIR/helper-bench run cargo run --release --example debug_cost 21; }

# Debug builds time table: 11 rounds (the builds are then up to date): ~1 min.
step debug_cost_11 60 "CARGO_TARGET_DIR=target/helper-bench cargo run --release --example debug_cost 11"
s_debug_cost_11() { CARGO_TARGET_DIR=$TARGET_DIR/helper-bench run cargo run --release --example debug_cost 11; }

# Peers table: 90 criterion benchmarks (batch-* with System and talc take
# ~25 s each at 1024 B): ~12-13 min. Then the table of medians.
step alloc 780 "cargo bench --bench alloc && python3 scripts/bench_table.py"
s_alloc() {
  local stamp=$RESULTS/.alloc-start
  touch "$stamp"
  run cargo bench --bench alloc
  echo
  run python3 scripts/bench_table.py "$TARGET_DIR/criterion"
  local stale
  stale=$(find "$TARGET_DIR/criterion" -path '*/new/estimates.json' ! -newer "$stamp" 2>/dev/null || true)
  if [[ -n $stale ]]; then
    echo
    echo "NOTE: criterion results older than this run (bench_table.py included them in the table above):"
    echo "$stale"
  fi
}

# Redraws docs/plots/*.png (tracked files) from the results above: seconds
# once built.
# Issue 20's rows run alone, each allocator in a process of its own
# (examples/profile, built with the bench profile by cg_profile_pair or
# here), interleaved over three rounds: realloc growth, the batch phases
# at 64 B, and 8 against 100 threads doing pairs. ~2 min.
step profile_rows 120 "\$REL/profile {kmemcg,jemalloc,mimalloc,system} {realloc-grow,batch-alloc/64,batch-free/64,threads/8,threads/100}, 3 interleaved rounds"
s_profile_rows() {
  [[ -x $REL/profile ]] || run cargo build --profile bench --example profile
  local round w a
  for round in 1 2 3; do
    for w in realloc-grow:2000000 batch-alloc/64:5000000 batch-free/64:5000000 threads/8:40000000 threads/100:40000000; do
      for a in kmemcg jemalloc mimalloc system; do
        echo "PROFILE round $round: $("$REL/profile" "$a" "${w%%:*}" "${w##*:}")"
      done
    done
  done
}

step plots 30 "cargo run --release -p kmemcg-plots"
s_plots() { run cargo run --release -p kmemcg-plots; }

# Kernels table, x86_64 row: kernel build, then a boot under a 120 s timeout.
step qemu_x86_64 150 "bash kernel-demo/run-qemu.sh"
s_qemu_x86_64() { run bash kernel-demo/run-qemu.sh; }

# Kernels table, aarch64 row: the same (KERNEL_DEMO_TIMEOUT, 120 s).
step qemu_aarch64 150 "bash kernel-demo/aarch64/run-qemu.sh"
s_qemu_aarch64() { run bash kernel-demo/aarch64/run-qemu.sh; }

# ---- main ----

FILTER=${1:-}
if [[ $FILTER == --list || $FILTER == -h || $FILTER == --help ]]; then
  total=0
  for i in "${!NAMES[@]}"; do
    printf '%-17s ~%4d s %-7s %s\n' "${NAMES[$i]}" "${EST[$i]}" "${OPTIN[$i]:+(optin)}" "${CMDS[$i]}"
    [[ -n ${OPTIN[$i]} ]] || total=$((total + EST[i]))
  done
  echo "default total ~$((total / 60)) min"
  exit 0
fi
if [[ -n $FILTER ]]; then
  set +e
  [[ x =~ $FILTER ]]
  rc=$?
  set -e
  if ((rc == 2)); then
    echo "bench_all: not a valid regex: $FILTER" >&2
    exit 2
  fi
fi

selected=()
est_total=0
for i in "${!NAMES[@]}"; do
  if [[ -n $FILTER ]]; then
    [[ ${NAMES[$i]} =~ $FILTER ]] || continue
  else
    [[ -z ${OPTIN[$i]} ]] || continue
  fi
  selected+=("$i")
  est_total=$((est_total + EST[i]))
done
if ((${#selected[@]} == 0)); then
  echo "bench_all: no step matches '$FILTER'; steps: ${NAMES[*]}" >&2
  exit 2
fi

mkdir -p "$LOGS" "$CG"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
  commit="$commit (+ uncommitted changes)"
fi
echo "bench_all: commit $commit, ${#selected[@]} steps, estimated ~$((est_total / 60)) min; logs in $LOGS"
echo "bench_all: load average $(cut -d' ' -f1-3 /proc/loadavg)"

failed=()
ran=()
all_start=$(date +%s.%N)
for i in "${selected[@]}"; do
  name=${NAMES[$i]}
  log=$LOGS/$name.log
  {
    echo "# step:    $name"
    echo "# command: ${CMDS[$i]}"
    echo "# commit:  $commit"
    echo "# started: $(date -Is), load average $(cut -d' ' -f1-3 /proc/loadavg), expected ~${EST[$i]} s"
    echo "# env:     CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-} RUSTFLAGS=${RUSTFLAGS:-}"
    echo
  } >"$log"
  echo "... $name (expected ~${EST[$i]} s)" >&2
  start=$(date +%s.%N)
  set +e
  (
    set -euo pipefail
    cd "$ROOT"
    "s_$name"
  ) >>"$log" 2>&1 </dev/null
  rc=$?
  set -e
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if ((rc == 0)); then
    status=ok
  else
    status="FAILED($rc)"
    failed+=("$name")
  fi
  ran+=("$name")
  printf '\n# finished: %s, %s s, exit %d\n' "$(date -Is)" "$secs" "$rc" >>"$log"
  printf '%-17s %-10s %8s s  %s\n' "$name" "$status" "$secs" "${CMDS[$i]}"
done
all_secs=$(awk -v a="$all_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')

# The computed counts and the kernels' bench lines, gathered from the logs.
summary=$(
  for name in "${ran[@]}"; do
    tr -d '\r' <"$LOGS/$name.log" | grep -aE '^CALLGRIND |^bench: ' || true
  done
)
if [[ -n $summary ]]; then
  echo
  echo "$summary"
fi
echo
echo "bench_all: ${#ran[@]} steps in $((all_secs / 60)) min $((all_secs % 60)) s; logs in $LOGS"
if ((${#failed[@]} > 0)); then
  echo "bench_all: FAILED steps: ${failed[*]} (see their logs)" >&2
  exit 1
fi
