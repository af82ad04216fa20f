# Source this on the GPU machine, from the repository root, before running gpuscope from the tree:
#   source tests/gpu/device_env.sh && python3 -m pytest -m gpu tests/gpu
# Wheels carried in .whl/ (NumPy 2.4.x: numba-cuda 0.30.4 cannot compile kernels under NumPy 2.5; h5py, h5netcdf;
# the nvtx package for tests/gpu/test_nvtx.py) are installed
# into /tmp/site, which goes first on PYTHONPATH, followed by the source tree.
# The GPU machine sets PYTHONDONTWRITEBYTECODE=1 and gets a fresh copy of the tree, so without the compileall below
# every process would compile gpuscope's and those wheels' sources again (0.2-0.5 s a process on the H100 machine),
# which a pip-installed gpuscope never does: the timings of docs/measurements.md are of compiled bytecode, as users
# run it. The variable stays set, so nothing else writes bytecode.
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
python3 -m compileall -q -j 0 gpuscope benchmarks tests /tmp/site >/dev/null 2>&1 || true
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
