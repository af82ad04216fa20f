source tests/gpu/device_env.sh
python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_short_kernels.py tests/gpu/test_replay_modes.py tests/gpu/test_topdown_kernels.py > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc $?"
grep -E "^(FAILED|ERROR)|passed|failed|^E |largest" $OUT/gpu_tests.log | head -30
python3 benchmarks/bench_stalls_vs_ncu.py --out $OUT/stalls > $OUT/bench.log 2>&1; echo "bench rc $?"
grep -v Warn $OUT/bench.log | grep -v "^  " | tail -24
