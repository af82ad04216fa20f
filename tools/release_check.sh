#!/usr/bin/env bash
# Release check: build the sdist and the wheel, `twine check` them, install the wheel in fresh virtual environments
# and run gpuscope from each, as someone who was handed the wheel would.
#
#   tools/release_check.sh [PYTHON]        # default python3; needs PyPI; about 5 minutes and 2 GB in /tmp
#
# 1. the core alone: the demo on the shipped recordings, with no CUDA, CUPTI or Numba installed;
# 2. [offline]: the README's main job from the wheel, and the metric catalog through CUPTI 13.1;
# 3. [cu13]: the demo's kernels compile to PTX (NVRTC and NVVM from pip; no GPU needed).
# Everything happens in a temporary folder, removed at the end; the checkout is only read.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpuscope-release.XXXXXX")
trap 'rm -rf "$work"' EXIT

step() { printf '\n== %s\n' "$*"; }
venv() { "$python" -m venv "$work/$1" && "$work/$1/bin/pip" install -q --upgrade pip; }

step "build the sdist and the wheel"
venv tools
"$work/tools/bin/pip" install -q build twine
"$work/tools/bin/python" -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
if grep -i "deprecat" "$work/build.log"; then echo "the build warns about something deprecated (above)" >&2; exit 1; fi
"$work/tools/bin/twine" check --strict "$work/dist/"*
wheel=$(ls "$work/dist/"*.whl)
ls -l "$work/dist"

cd "$work"  # from here on, no gpuscope/ folder beside the interpreter: imports come from the wheel

step "the core alone: analysis of the shipped recordings"
venv core
core/bin/pip install -q "$wheel"
core/bin/gpuscope demo --out demo-core >demo-core.log
tail -3 demo-core.log
core/bin/python - <<'EOF'
import importlib.util
installed = [m for m in ("numba", "llvmlite", "cuda.bindings", "scipy") if importlib.util.find_spec(m.split(".")[0])]
assert not installed, f"the core install brought {installed}"
print("core: no Numba, llvmlite, cuda-bindings or scipy")
EOF

step "[offline]: the README's main job"
venv offline
offline/bin/pip install -q "$wheel[offline]"
offline/bin/gpuscope demo --out demo-offline >demo-offline.log
tail -3 demo-offline.log
offline/bin/gpuscope metrics --chip GH100 --passes topdown

step "[cu13]: the demo's kernels compile to PTX"
venv cu13
cu13/bin/pip install -q "$wheel[cu13]"
env -u NUMBA_ENABLE_CUDASIM cu13/bin/python -c '
from gpuscope._commands import demo
for name, text in demo.ptx((9, 0)).items():
    assert ".target sm_90" in text and text.count(".entry") == 1, name
    print(name, len(text), "characters of PTX")
'
du -sh core offline cu13

step "release check passed"
