"""The short-kernel workload of the stall-share benchmark and the probes that measured it: one PyTorch training step
of a small MLP block (bf16 autocast, fused AdamW: about 30 launches of 2-50 us), five CuPy launches on 1 M elements
(elementwise, a reduction, a small GEMM) and the two long Numba kernels of ``workloads.py`` (stream ~0.2 ms, FMA
~0.5 ms); gpuscope's kernel-mode session and ncu's run over the same launches.

Used by ``benchmarks/bench_stalls_vs_ncu.py``, ``tests/gpu/test_short_kernels.py`` and the probes of
``probes/`` that measured the same launches. ``python3 benchmarks/short_kernels.py workload --reps N`` is the child
that :func:`run_ncu` profiles (between ``cudaProfilerStart`` and ``cudaProfilerStop``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import subprocess
import sys
import time

import numpy as np

REASONS = ("no_instruction", "barrier", "membar", "branch_resolving", "sleeping", "misc", "dispatch_stall",
           "math_pipe_throttle", "long_scoreboard", "imc_miss", "mio_throttle", "drain", "lg_throttle",
           "short_scoreboard", "wait", "tex_throttle", "selected", "not_selected")
PCT = "smsp__warp_issue_stalled_{}_per_warp_active.pct"
RAW = "smsp__warps_issue_stalled_{}.sum"
DENOM = ("sm__warps_active.sum", "sm__cycles_elapsed.max", "gpu__time_duration.sum")


class Work:
    """The launches of one repetition, built once (compilation and allocation outside the sessions)."""

    def __init__(self):
        import cupy as cp
        import torch
        from numba import cuda

        import workloads

        torch.manual_seed(0)
        dev = "cuda"
        self.torch, self.cp, self.cuda = torch, cp, cuda
        self.model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024),
                                         torch.nn.LayerNorm(1024)).to(dev)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.x = torch.randn(256, 1024, device=dev)
        self.target = torch.randn(256, 1024, device=dev)
        n = 1 << 20
        self.a = cp.arange(n, dtype=cp.float32)
        self.b = cp.ones(n, dtype=cp.float32)
        self.m = cp.ones((256, 256), dtype=cp.float32)
        self.sf = workloads.StreamFma()

    def step(self):
        torch, cp = self.torch, self.cp
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(self.model(self.x).float(), self.target)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        y = self.a * 2.0 + self.b
        cp.sum(y)
        cp.exp(self.a * 1e-7)
        cp.maximum(self.a, self.b)
        self.m @ self.m
        self.sf.stream()
        self.sf.fma(2000)
        self.cuda.synchronize()


class TransformerWork:
    """One training step of a transformer encoder layer (d=512, 8 heads, bf16 autocast, SDPA, fused AdamW, batch
    16 x 256 tokens; ``tests/gpu/scripts/torch_step.py``'s): cuBLAS ``nvjet`` GEMMs of 10-60 us among short
    elementwise kernels, the step of issue 51's measurements."""

    def __init__(self):
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True,
                                                      dropout=0.0).cuda()
        self.opt = torch.optim.AdamW(self.layer.parameters(), lr=1e-4, fused=True)
        self.x = torch.randn(16, 256, 512, device="cuda")

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        with self.torch.autocast("cuda", dtype=self.torch.bfloat16):
            loss = self.layer(self.x).float().pow(2).mean()
        loss.backward()
        self.opt.step()
        self.torch.cuda.synchronize()


WORKLOADS = {"short": Work, "transformer": TransformerWork}


def workload(reps: int, profile_start: bool, name: str = "short"):
    work = WORKLOADS[name]()
    work.step()
    work.step()
    if profile_start:
        _cudart().cudaProfilerStart()
    for _ in range(reps):
        work.step()
    if profile_start:
        _cudart().cudaProfilerStop()


def _cudart():
    """The CUDA runtime for cudaProfilerStart/Stop (PyTorch's, where CuPy is not used)."""
    import torch

    return torch.cuda.cudart()


class ImageTap:
    """Keeps a copy of every counter-data image the session evaluates (once per content)."""

    def __init__(self):
        self.images, self.seen = [], set()

    def __enter__(self):
        from gpuscope.cupti import host

        self._orig = orig = host.ProfilerHost.evaluate
        tap = self

        def evaluate(h, image, index, metrics):
            data = np.asarray(image)
            key = (data.ctypes.data, hashlib.sha1(data.tobytes()).hexdigest())
            if key not in tap.seen:
                tap.seen.add(key)
                tap.images.append(data.copy())
            return orig(h, image, index, metrics)

        host.ProfilerHost.evaluate = evaluate
        return self

    def __exit__(self, *exc):
        from gpuscope.cupti import host

        host.ProfilerHost.evaluate = self._orig


def session(work, reps, metrics, groups=None, tap=None):
    import gpuscope as gs

    t0 = time.perf_counter()
    with gs.Profiler(metrics=metrics, mode="kernel", pass_groups=groups) as prof:
        for _ in range(reps):
            work.step()
    ds = prof.dataset
    wall = time.perf_counter() - t0
    rows = [{"kernel": str(k)} for k in ds["kernel"].values]
    for m in metrics:
        for row, v in zip(rows, ds[m].values):
            row[m] = float(v)
    return {"rows": rows, "passes": prof.passes, "wall_s": wall, "config": prof._config if tap else None}


def run_ncu(ncu, metrics, reps, extra=(), child=None):
    """ncu on :func:`workload` in a child process (kernel replay unless *extra* says otherwise), its rows parsed.
    *child*: another script and its arguments to run instead (it profiles between cudaProfilerStart and Stop)."""
    child = child if child is not None else [__file__, "workload", "--reps", str(reps)]
    cache = () if "--cache-control" in extra else ("--cache-control", "none")  # ncu refuses an option twice
    cmd = [ncu, "--metrics", ",".join(metrics), "--csv", "--page", "raw", "--clock-control", "none", *cache,
           "--profile-from-start", "off", *extra, sys.executable, *child]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rows = [{"kernel": r["Kernel Name"], **values} for r, values in ncu_rows(proc, metrics)]
    return {"rows": rows, "wall_s": wall, "cmd": " ".join(cmd)}


def ncu_rows(proc, metrics):
    """``(csv row, {metric: value})`` of each result in the output of ``ncu --csv --page raw`` (*proc*: its
    completed process); a metric ncu did not give is NaN. Raises RuntimeError where ncu gave no result."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('"')]
    table = list(csv.DictReader(io.StringIO("\n".join(lines))))[1:]  # the second row holds units
    if not table:
        raise RuntimeError(f"ncu gave no rows (rc {proc.returncode}): {proc.stderr[-800:]}")
    out = []
    for r in table:
        values = {}
        for m in metrics:
            try:
                values[m] = float(r[m].replace(",", ""))
            except (KeyError, ValueError):
                values[m] = float("nan")
        out.append((r, values))
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="the child that run_ncu profiles")
    ap.add_argument("mode", choices=["workload"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="short")
    args = ap.parse_args()
    workload(args.reps, profile_start=True, name=args.workload)
