#!/usr/bin/env bash
# On the 2-GPU machine, from the repository root (carry .whl-multi/ and .whl/): the Dask-CUDA and MPI examples and
# tests/gpu/test_multi_gpu.py, with logs under ${OUT:-/tmp/gpuscope-multi}. Prints a short summary last.
#   bash benchmarks/multi_gpu_check.sh
set -u
OUT=${OUT:-/tmp/gpuscope-multi}; mkdir -p "$OUT"
source tests/gpu/device_env.sh > "$OUT/env.log" 2>&1
source tests/gpu/multi_env.sh >> "$OUT/env.log" 2>&1
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
{
    echo "gpus: $(grep -c '^GPU' "$OUT/gpus.txt")"
    grep '^multi_env' "$OUT/env.log"
} > "$OUT/summary.txt"
timeout 150 python3 examples/dask_two_gpus.py --out "$OUT/dask_merged.nc" > "$OUT/dask_example.log" 2>&1
echo "dask example rc=$?" >> "$OUT/summary.txt"
timeout 150 mpiexec -n 2 python3 examples/mpi_two_gpus.py --out "$OUT/mpi_merged.nc" \
    --files "$OUT/mpi-prof-{rank}.nc" > "$OUT/mpi_example.log" 2>&1
echo "mpi example rc=$?" >> "$OUT/summary.txt"
timeout 250 python3 -m pytest -m gpu -v -p no:cacheprovider -rA tests/gpu/test_multi_gpu.py > "$OUT/gpu_tests.log" 2>&1
echo "test_multi_gpu rc=$?" >> "$OUT/summary.txt"
tail -n 4 "$OUT/dask_example.log" "$OUT/mpi_example.log" >> "$OUT/summary.txt" 2>&1
grep -E "passed|failed|skipped" "$OUT/gpu_tests.log" | tail -1 >> "$OUT/summary.txt"
grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/gpu_tests.log" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
