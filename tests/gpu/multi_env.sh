# Source this on the GPU machine (no internet), from the repository root, after tests/gpu/device_env.sh:
#   source tests/gpu/device_env.sh && source tests/gpu/multi_env.sh
# Installs the wheels carried in .whl-multi/ (dask, distributed, dask-cuda, mpi4py, mpich and their pure-Python
# dependencies; cp312 manylinux x86_64) offline into python3's user site, keeping the NumPy, pandas and cuda-core
# already there (numba-cuda 0.30.4 cannot compile under NumPy 2.5), and puts MPICH's mpiexec on PATH.
_multi_here=$PWD/.whl-multi
if ls "$_multi_here"/*.whl >/dev/null 2>&1; then
    _constraints=$(mktemp)
    python3 - "$_constraints" <<'PY'
import importlib.metadata as md, sys
pins = []
for dist in ("numpy", "pandas", "cuda-core", "cuda-pathfinder", "numba", "llvmlite", "pillow", "contourpy",
             "python-dateutil"):
    try:
        pins.append(f"{dist}=={md.version(dist)}")
    except md.PackageNotFoundError:
        pass
open(sys.argv[1], "w").write("\n".join(pins) + "\n")
PY
    # Only what is missing: the machine may already have mpi4py (built against its own MPI) and an mpiexec.
    _want=$(python3 - <<'PY'
import importlib.util, shutil
want = [dist for module, dist in (("distributed", "distributed"), ("dask_cuda", "dask-cuda"),
                                  ("mpi4py", "mpi4py"), ("pynvml", "pynvml"))
        if importlib.util.find_spec(module) is None]
if shutil.which("mpiexec") is None:
    want.append("mpich")
print(" ".join(want))
PY
)
    # A virtualenv's python cannot take --user installs: install into it then.
    _where="--user"
    if python3 -c 'import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)'; then _where=""; fi
    _extra=""
    if python3 -m pip install --help 2>/dev/null | grep -q -- "--break-system-packages"; then
        _extra="--break-system-packages"
    fi
    if [ -n "$_want" ]; then
        python3 -m pip install -q $_where $_extra --no-index --find-links "$_multi_here" -c "$_constraints" \
            $_want || echo "multi_env.sh: pip install failed (see above)" >&2
    fi
    rm -f "$_constraints"
fi
export PATH=$(python3 -m site --user-base)/bin:$PATH
# The GPU machines run as root; Open MPI's mpiexec refuses that unless told (MPICH ignores these).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
python3 - <<'PY'
import importlib
for name in ("distributed", "dask_cuda", "mpi4py"):
    try:
        m = importlib.import_module(name)
        print(f"multi_env: {name} {getattr(m, '__version__', '?')}")
    except Exception as e:  # report, do not stop the shell that sourced this
        print(f"multi_env: {name} NOT importable: {e}")
PY
command -v mpiexec >/dev/null && echo "multi_env: mpiexec $(command -v mpiexec)" || echo "multi_env: no mpiexec"
