#!/usr/bin/env bash
# On the GPU machine, from the repository root: each benchmark that launches benchmarks/workloads.py's kernels, run
# briefly (small launch counts, short sweeps, no ncu), to check that the shared workloads still drive them. Logs go
# to ${OUT:-/tmp/gpuscope-check}/workloads.log; one line per script (rc and seconds) is printed last.
#   bash benchmarks/check_workloads.sh
set -u
OUT=${OUT:-/tmp/gpuscope-check}; mkdir -p "$OUT"
source tests/gpu/device_env.sh >/dev/null 2>&1
LOG="$OUT/workloads.log"; : > "$LOG"
SUMMARY=""
run() {
    local name=$1; shift
    local t0=$SECONDS
    echo "===== $name: $*" >> "$LOG"
    (cd /tmp && timeout 150 python3 "$OLDPWD/benchmarks/$@") >> "$LOG" 2>&1
    local rc=$?
    SUMMARY+="$name rc=$rc $((SECONDS - t0))s"$'\n'
}
run replay_modes bench_replay_modes.py --launches 40 --no-ncu
run range_vs_ncu bench_range_vs_ncu.py --launches 20 --out /tmp/range_vs_ncu.json
run pm_sampling bench_pm_sampling.py --long-seconds 0 --sweep-seconds 0.5 --no-decode-cost --out /tmp/pm.json
run record_phases record_phases.py --only idle_gaps --out /tmp/phases_out
run fast_topdown bench_fast_topdown.py validate
run records_twice ../probes/probe_kernel_records_twice.py --only none sample
printf "%s" "$SUMMARY" | tee -a "$LOG"
