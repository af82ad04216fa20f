#!/usr/bin/env bash
# On the GPU machine, from the repository root: the GPU tests (in a random order), then the quickstart's GPU
# snippets, the tutorials and a live demo, with logs under ${OUT:-/tmp/gpuscope-check}. Prints a short summary
# last. The GPU tests take about 10 minutes: each half fits one 600 s device call, and so do the tutorials:
#   bash benchmarks/device_check.sh tests1       # GPUSCOPE_TEST_SHUFFLE=<seed> picks the order (default 1)
#   bash benchmarks/device_check.sh tests2
#   bash benchmarks/device_check.sh tutorials
# (``tests`` runs both halves, one after the other; ``all`` everything.)
set -u
OUT=${OUT:-/tmp/gpuscope-check}; mkdir -p "$OUT"
PART=${1:-all}
source tests/gpu/device_env.sh >/dev/null 2>&1
: > "$OUT/summary.txt"
HALF1="test_cli_run test_fast_topdown_order test_finalize test_found_iterations test_foundation test_kernel_names
       test_kernel_times test_multi_gpu test_nvtx test_pc_sampling test_pytorch"
gpu_tests() {  # $1: the log's name; the rest: test files
    local name=$1; shift
    GPUSCOPE_TEST_SHUFFLE=${GPUSCOPE_TEST_SHUFFLE:-1} timeout 580 python3 -m pytest -m gpu -v -p no:cacheprovider -rA \
        --tb=short --durations=15 -o faulthandler_timeout=150 "$@" > "$OUT/$name.log" 2>&1
    echo "$name rc=$?" >> "$OUT/summary.txt"
    grep -E "shuffled|passed|failed" "$OUT/$name.log" | tail -2 >> "$OUT/summary.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/$name.log" >> "$OUT/summary.txt"
}
first=(); second=()
for f in tests/gpu/test_*.py; do
    case " $(echo $HALF1) " in *" $(basename "$f" .py) "*) first+=("$f") ;; *) second+=("$f") ;; esac
done
case "$PART" in tests1|tests|all) gpu_tests gpu_tests1 "${first[@]}" ;; esac
case "$PART" in tests2|tests|all) gpu_tests gpu_tests2 "${second[@]}" ;; esac
case "$PART" in tests1|tests2|tests) cat "$OUT/summary.txt"; exit 0 ;; esac
python3 - <<'PY'
import re, pathlib
for page in ("quickstart", "pytorch"):
    text = pathlib.Path(f"docs/{page}.md").read_text()
    for i, m in enumerate(re.finditer(r"<!-- gpu -->\n```python\n(.*?)```", text, re.S)):
        pathlib.Path(f"/tmp/snippet_{page}_{i}.py").write_text(m.group(1))
PY
for f in /tmp/snippet_*.py; do
    name=$(basename "$f" .py)
    (cd /tmp && timeout 120 python3 "$f" > "$OUT/$name.log" 2>&1; rc=$?; echo "$name rc=$rc" >> "$OUT/summary.txt")
done
mkdir -p /tmp/tutorial_out
for t in tutorials/*.py; do
    case "$t" in
        *sampling_phases.py) args=(--out /tmp/tutorial_out/sampling_phases.png) ;;
        *report_workload.py) args=() ;;
        *ranges_and_decorators.py) args=(/tmp/tutorial_out/ranges.nc) ;;
        *) args=(/tmp/tutorial_out) ;;
    esac
    name=$(basename "$t" .py)
    timeout 150 python3 "$t" "${args[@]}" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc" >> "$OUT/summary.txt"
done
(cd /tmp && timeout 150 python3 -m gpuscope demo > "$OUT/demo.log" 2>&1; echo "live demo rc=$?" >> "$OUT/summary.txt")
grep -E "segments between change points|look alike" "$OUT/demo.log" >> "$OUT/summary.txt"
ls /tmp/tutorial_out /tmp/*.png >> "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
