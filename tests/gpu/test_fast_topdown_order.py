"""Fast Top-Down in any order (issue 33 item 5): after counter sessions in the same process, its PC block detaches
CUPTI and every kernel gets PC samples. Each case runs in a fresh process, as reported: what ran before in the
process is the point."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

REPORT = r"""
def report(fast, sessions):
    without = fast.attrs.get("kernels_without_pc_samples")
    print(json.dumps({
        "kernels": sorted(str(k) for k in fast.kernel.values),
        "counter_kernels": sorted({str(k) for ds in sessions for k in ds.kernel.values if str(k)}),
        "without_pc": [str(k) for k in np.atleast_1d(without) if str(k)] if without is not None else [],
        "unattributed": int(fast.attrs["pc_unattributed_samples"]),
        "samples": [int(n) for n in fast.pc_samples.values],
        "detach": str(fast.attrs.get("cupti_detach")),
        "warned": [str(w.message) for w in caught if "PC samples" in str(w.message)],
    }))
"""

# The reported sequence: an iteration-mode session, then a kernel-mode session over 7 steps of a 3-kernel loop, then
# gs.profile_fast_topdown(loop, 2). It gave FastTopDownError, 265 of 265 PC samples unattributed.
NUMBA = r"""
import json, warnings
import numpy as np
from numba import cuda
import gpuscope as gs
from benchmarks import workloads as W

w = W.StreamFma(n=1 << 22)
t = cuda.to_device(np.zeros(1 << 22, np.float32))

def loop(steps):
    for _ in range(steps):
        w.stream()
        w.fma(400)
        W.tiny[W.blocks(t.size), W.THREADS](t)
    cuda.synchronize()

loop(1)  # compiled and loaded before any CUPTI call
with gs.Profiler("topdown", mode="iteration") as first:
    for _ in range(first.passes + 1):
        first.step()
        loop(1)
with gs.Profiler("topdown", mode="kernel") as second:
    loop(7)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fast = gs.profile_fast_topdown(loop, 2)
""" + REPORT + """
report(fast, [first.dataset, second.dataset])
"""

# The same in a PyTorch process, after one iteration-mode session (it gave 2 kernels without samples).
TORCH = r"""
import json, warnings
import numpy as np
import torch
import gpuscope as gs

a = torch.randn(2048, 2048, device="cuda")
x = torch.randn(1 << 22, device="cuda")

def step(n):
    for _ in range(n):
        torch.relu(a @ a)
        (x * 2.0 + 1.0).sum()
    torch.cuda.synchronize()

step(2)  # cuBLAS and the elementwise kernels loaded before any CUPTI call
with gs.Profiler("topdown", mode="iteration") as first:
    for _ in range(first.passes + 1):
        first.step()
        step(1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fast = gs.profile_fast_topdown(step, 2)
""" + REPORT + """
report(fast, [first.dataset])
"""


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _every_kernel_sampled(got: dict, expected: int) -> None:
    assert got["detach"] == "detached", got
    assert len(got["kernels"]) == expected and not got["without_pc"], got
    assert got["unattributed"] == 0 and all(n > 0 for n in got["samples"]), got
    assert not got["warned"], got
    # one name per kernel: the fast Top-Down names its kernels as the counter sessions did
    assert set(got["kernels"]) <= set(got["counter_kernels"]), got


def test_iteration_then_kernel_then_fast_topdown_attributes_every_kernel():
    got = _run(NUMBA)
    assert got["kernels"] == ["fma", "stream", "tiny"], got
    _every_kernel_sampled(got, 3)


def test_in_a_pytorch_process_after_an_iteration_session_fast_topdown_attributes_every_kernel():
    pytest.importorskip("torch")
    got = _run(TORCH)
    _every_kernel_sampled(got, len(got["kernels"]))
    assert len(got["kernels"]) >= 2, got  # the GEMM and at least one elementwise or reduction kernel
