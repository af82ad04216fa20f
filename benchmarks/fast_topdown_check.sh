#!/usr/bin/env bash
# On the GPU machine, from the repository root: every measurement of benchmarks/bench_fast_topdown.py, JSON and
# logs under ${OUT:-/tmp/gpuscope-fast}, a short summary last.
#   bash benchmarks/fast_topdown_check.sh
set -u
OUT=${OUT:-/tmp/gpuscope-fast}; mkdir -p "$OUT"
source tests/gpu/device_env.sh >/dev/null 2>&1
B=benchmarks/bench_fast_topdown.py
for step in "validate --validate-periods 1024 8192" "cost --launches 200 --periods 1024 8192 32768 --repeats 3" \
            "breakdown --launches 200 --repeats 2" "pcstart --period 8192" "periods" "together" "sessions --rounds 24"; do
    name=${step%% *}
    timeout 280 python3 $B $step --out "$OUT/fast_$name.json" > "$OUT/fast_$name.log" 2>&1
    echo "fast $name rc=$?" >> "$OUT/fast_summary.txt"
done
grep -hE "^WORST|^ATTRS" "$OUT/fast_validate.log" >> "$OUT/fast_summary.txt"
grep -hE "ms/launch|^NCU" "$OUT/fast_cost.log" >> "$OUT/fast_summary.txt"
grep -hE "^CALL|EXECUTIONS|^LAUNCHES" "$OUT/fast_breakdown.log" | cut -c1-400 >> "$OUT/fast_summary.txt"
grep -h "^PCSTART" "$OUT/fast_pcstart.log" >> "$OUT/fast_summary.txt"
cat "$OUT/fast_summary.txt"
