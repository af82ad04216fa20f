# Source this on the GPU machine, from the repository root, before running gpuscope from the tree:
#   source tests/gpu/device_env.sh && python3 -m pytest -m gpu tests/gpu
# Wheels carried in .whl/ (NumPy 2.4.x: numba-cuda 0.30.4 cannot compile kernels under NumPy 2.5; h5py, h5netcdf;
# the nvtx package for tests/gpu/test_nvtx.py) are installed
# into /tmp/site, which goes first on PYTHONPATH, followed by the source tree.
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
