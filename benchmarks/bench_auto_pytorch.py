"""`gpuscope run` on an unmodified PyTorch training script: coverage and cost of auto mode, against the same loop
annotated with ``gpuscope.range`` and against ncu, in one run.

Run on the GPU machine from the repository root (PyTorch is installed there; it is a test workload, not a gpuscope
dependency):

    source tests/gpu/device_env.sh; python3 benchmarks/bench_auto_pytorch.py --out $OUT/auto

The script (written to ``--out``): one transformer encoder layer (d=1024, 16 heads, bf16 autocast, SDPA attention,
fused AdamW) on a batch of 8 x 256 tokens, ``--warmup`` steps then ``--steps`` steps. Cases, each a process of its
own, wall time of the whole process:

* ``plain``: ``python3 script.py``;
* ``auto``: ``python3 -m gpuscope run --set topdown -o auto.nc script.py`` (the script as it is);
* ``annotated``: the same with ``--annotate``, where the script puts each step in ``gpuscope.range("step")``;
* ``ncu``: ``ncu --metrics <topdown> --clock-control none --cache-control none -c N`` on the first N launches
  (``--ncu-count``; every launch of the script would take ncu minutes), its cost per launch.

Prints per case the wall time, the time over the plain process, the rows and the launches profiled; for auto mode
the coverage the Dataset reports (launches seen, profiled, unprofiled by reason) and the share of the launches of
the measured steps that it profiled, at least (profiled launches minus all warm-up launches, over the steps'
launches, taking the period found as the launches per step). Writes ``auto.json``.

``--record-stream FILE.npz`` instead runs the script in this process under gpuscope's launch callbacks alone (no
session, nothing profiled) and writes the launch stream the driver saw: each launch's kernel symbol (an index into
``symbols``), grid and block. ``tests/fixtures/range/pytorch_stream_gh100.npz`` is that recording on the H100, on
which ``tests/unit/test_pytorch_stream.py`` runs the loop finder and auto mode's bookkeeping.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = '''
import sys
import torch

annotate = "--annotate" in sys.argv
warmup, steps = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True, dropout=0.0).cuda()
opt = torch.optim.AdamW(layer.parameters(), lr=1e-4, fused=True)
x = torch.randn(8, 256, 1024, device="cuda")


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = layer(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


for _ in range(warmup):
    step()
torch.cuda.synchronize()
if annotate:
    import gpuscope as gs
    for _ in range(steps):
        with gs.range("step"):
            step()
else:
    for _ in range(steps):
        step()
torch.cuda.synchronize()
'''


def run(cmd, env=None, timeout=540):
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... rc {proc.returncode}: {proc.stderr[-1500:]}")
    return wall, proc


def record_stream(path: str, warmup: int, steps: int) -> None:
    """The launches of SCRIPT as the driver sees them, in order: symbols, grid and block."""
    import numpy as np

    from gpuscope.cupti.callbacks import LaunchRecorder

    seen = []
    recorder = LaunchRecorder(lambda launch: seen.append((launch.symbol, launch.grid, launch.block)))
    try:
        sys.argv = ["train_step.py", str(warmup), str(steps)]
        exec(compile(SCRIPT, "train_step.py", "exec"), {"__name__": "__main__"})
    finally:
        recorder.close()
    symbols = sorted({s for s, _, _ in seen})
    index = {s: i for i, s in enumerate(symbols)}
    np.savez_compressed(path, symbols=np.array(symbols), symbol=np.array([index[s] for s, _, _ in seen], np.int32),
                        grid=np.array([g for _, g, _ in seen], np.int64), block=np.array([b for _, _, b in seen],
                                                                                        np.int64),
                        warmup=warmup, steps=steps)
    print(f"{len(seen)} launches of {len(symbols)} kernels written to {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--ncu-count", type=int, default=76)
    ap.add_argument("--out", default="auto_out")
    ap.add_argument("--record-stream", metavar="FILE", help="record the script's launch stream to FILE (.npz)")
    args = ap.parse_args()
    if args.record_stream:
        record_stream(args.record_stream, args.warmup, args.steps)
        return
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    script = out / "train_step.py"
    script.write_text(SCRIPT)
    py = sys.executable
    env = dict(os.environ)
    sargs = [str(args.warmup), str(args.steps)]
    res = {}
    res["plain"] = {"wall_s": min(run([py, str(script), *sargs])[0] for _ in range(2))}
    for name, extra in (("auto", []), ("annotated", ["--annotate"])):
        nc = out / f"{name}.nc"
        wall, proc = run([py, "-m", "gpuscope", "run", "--set", "topdown", "-f", "-o", str(nc), str(script),
                          *sargs, *extra], env)
        res[name] = {"wall_s": wall, "report_head": proc.stdout[:1500], "stderr_tail": proc.stderr[-1500:]}
        import gpuscope as gs

        ds = gs.open_dataset(nc)
        keys = ("mode", "launches_seen", "launches_profiled", "launches_unprofiled", "launches_unprofiled_by_reason",
                "repetition_period", "passes", "loop_first_launch", "launches_from_the_loop",
                "launches_profiled_from_the_loop", "launches_searching_in_the_loop",
                "launches_completed_from_earlier_group", "passes_from_earlier_group")
        res[name].update({k: ds.attrs[k] for k in keys if k in ds.attrs})
        res[name]["rows"] = int(ds.sizes["range"])
        if "iterations" in ds:
            res[name]["launches_in_rows"] = int(ds["iterations"].values.sum())
    try:
        metrics = ",".join(gs.metric_set("topdown").metrics)
        wall, _ = run([args.ncu, "--metrics", metrics, "--clock-control", "none", "--cache-control", "none", "-c",
                       str(args.ncu_count), py, str(script), *sargs])
        res["ncu"] = {"wall_s": wall, "launches": args.ncu_count}
    except Exception as exc:  # ncu's failure is reported, not fatal
        res["ncu"] = {"error": repr(exc)}
    (out / "auto.json").write_text(json.dumps(res, indent=1, default=str))
    plain = res["plain"]["wall_s"]
    per_step = res["auto"].get("repetition_period")  # the loop auto mode followed: launches per step
    print(f"plain process: {plain:.1f} s")
    for name in ("auto", "annotated", "ncu"):
        r = res[name]
        if "error" in r:
            print(f"{name}: {r['error'][:300]}")
            continue
        over = r["wall_s"] - plain
        line = f"{name}: {r['wall_s']:.1f} s, {over:.1f} s over plain"
        if "rows" in r:
            line += f", {r['rows']} rows, launches profiled {r.get('launches_profiled', r.get('launches_in_rows'))}"
        if name == "ncu":
            line += f", {r['launches']} launches, {1e3 * over / r['launches']:.0f} ms per launch over plain"
        print(line)
    a = res["auto"]
    if per_step and "launches_seen" in a:
        steps_launches = per_step * args.steps
        warm = a["launches_seen"] - steps_launches
        at_least = (a["launches_profiled"] - warm) / steps_launches
        print(f"auto: {a['launches_seen']} launches seen, {a['launches_profiled']} profiled, unprofiled by reason "
              f"{a.get('launches_unprofiled_by_reason')}; launches per step {per_step} (the period found); of the "
              f"{steps_launches} launches of the {args.steps} steps, at least {100 * at_least:.1f}% profiled")
    if "launches_from_the_loop" in a:
        after = a["launches_from_the_loop"] - a["launches_searching_in_the_loop"]
        print(f"auto: from the loop's first launch ({a['loop_first_launch']}) on, "
              f"{a['launches_profiled_from_the_loop']} of {a['launches_from_the_loop']} profiled, "
              f"{a['launches_searching_in_the_loop']} of them while searching; "
              f"after the search {100 * a['launches_profiled_from_the_loop'] / max(after, 1):.1f}% profiled "
              f"({a.get('launches_completed_from_earlier_group', 0)} in the last pass group, "
              f"{a.get('passes_from_earlier_group', 0)} passes from the group before)")
    if res["annotated"].get("wall_s") and res["auto"].get("wall_s"):
        ratio = (res["auto"]["wall_s"] - plain) / max(res["annotated"]["wall_s"] - plain, 1e-9)
        print(f"auto over plain / annotated over plain: {ratio:.2f}")


if __name__ == "__main__":
    main()
