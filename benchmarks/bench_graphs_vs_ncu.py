"""CUDA graphs node by node against Nsight Compute's ``--graph-profiling node``, kernel node by kernel node.

Run on the GPU machine from the repository root (JAX and PyTorch are installed there; they are test workloads, not
gpuscope dependencies):

    source tests/gpu/device_env.sh; python3 benchmarks/bench_graphs_vs_ncu.py --out $OUT/graphs

Workloads, each in its own process: ``jax``, the jitted MLP training step of ``tests/gpu/scripts/jax_mlp.py`` (bf16
matmuls, Adam written out) with
XLA's command buffers on (the default), so that after warm-up each step is one CUDA graph launch, and autotuning off
(``--xla_gpu_autotune_level=0``: under ncu it compiles for minutes); ``torch``, a
PyTorch MLP training step (bf16, capturable Adam) captured once with ``torch.cuda.graph`` and replayed;
``torch-eager``, the same step launched eagerly, kernel mode's cost per launch for comparison. After ``--warmup``
steps, ``--steps`` steps are profiled:

- gpuscope: ``gs.Profiler("topdown", mode="kernel", graphs="node")`` around the steps (``gs.watch_graphs()`` at
  the start of the process, so that the graphs are copied as they are made), timed from entering the session to
  holding its Dataset;
- ``ncu --graph-profiling node --clock-control none --cache-control none`` with the set's stall shares and
  duration, between ``cudaProfilerStart`` and ``cudaProfilerStop`` around the same steps, twice.

Rows are matched by launch shape (grid, block) in order of appearance (ncu names kernels by their demangled
signatures). Per row: the largest difference over the
stall shares, on the shares over their sum (the Top-Down's measure) and raw, against ``ncu_1``; ``ncu_2`` against
``ncu_1`` is the yardstick; by ncu's duration bucket. Costs: the whole process of each tool, plain, and gpuscope's
session per profiled kernel node against kernel mode's per eager launch. Writes ``graphs.json`` (every row), a CPU
fixture ``graph_nodes_<workload>_gh100.npz`` (the session's rows beside ncu's) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

BUCKETS = (("< 10 us", 0, 10), ("10-50 us", 10, 50), (">= 50 us", 50, np.inf))
STALL = "smsp__warp_issue_stalled_"


# ---------------------------------------------------------------------------------------------------------- workloads
def jax_step():
    """tests/gpu/scripts/jax_mlp.py's training step (the script ``gpuscope run`` was measured on), on its data."""
    import jax

    sys.path.insert(0, str(HERE.parent / "tests" / "gpu" / "scripts"))
    import jax_mlp

    params = jax_mlp.init(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2048, 512), jax.numpy.float32)
    y = jax.random.normal(jax.random.PRNGKey(2), (2048, 256), jax.numpy.float32)
    zeros = jax.tree_util.tree_map(jax.numpy.zeros_like, params)
    state = [params, zeros, zeros, 0]

    def run():
        state[3] += 1
        state[0], state[1], state[2], loss = jax_mlp.step(state[0], state[1], state[2], jax.numpy.float32(state[3]),
                                                          x, y)
        loss.block_until_ready()

    return run


def torch_step(graph=True):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024),
                                torch.nn.LayerNorm(1024)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    x = torch.randn(4096, 1024, device="cuda")
    y = torch.randn(4096, 1024, device="cuda")

    def once():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            once()
    torch.cuda.current_stream().wait_stream(side)
    if not graph:
        def run():
            once()
            torch.cuda.synchronize()
        return run
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        once()

    def run():
        g.replay()
        torch.cuda.synchronize()

    return run


def work(args):
    """The child: warm up, then the profiled steps under gpuscope (--gpuscope FILE) or between the profiler's
    start and stop (for ncu, or plain)."""
    t_process = time.perf_counter()
    import os

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # as gpuscope run sets it: no 75% reserve
    # XLA's autotuning compiles and times candidates for minutes under ncu (its slow-compile alarm; ncu's run did not
    # end within 150 s on the H200): the same fixed choice in every process, so the kernels compared are the same
    os.environ.setdefault("XLA_FLAGS", "--xla_gpu_autotune_level=0")
    import gpuscope as gs

    if args.gpuscope and args.workload != "torch-eager":
        gs.watch_graphs()  # before the graphs are made: gpuscope copies each as it is instantiated
    step = {"jax": jax_step, "torch": torch_step, "torch-eager": lambda: torch_step(graph=False)}[args.workload]()
    for _ in range(args.warmup):
        step()
    out = {"workload": args.workload, "steps": args.steps}
    if args.gpuscope:
        t0 = time.perf_counter()
        with gs.Profiler("topdown", mode="kernel", graphs="node") as prof:
            for _ in range(args.steps):
                step()
        ds = prof.dataset
        out["session_s"] = time.perf_counter() - t0
        if args.fixture:  # every row (the eager ones have graph_launch -1)
            fixture(prof, ds, args.fixture)
        out["attrs"] = {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in ds.attrs.items()
                        if k.startswith(("graph_", "launches_"))}
        out["all_rows"] = ds.sizes["range"]
        ds = ds.isel(range=np.flatnonzero(ds["graph_launch"].values >= 0)) if args.workload != "torch-eager" else ds
        out["rows"] = rows_of(ds)
    else:
        from cuda.bindings import runtime

        t0 = time.perf_counter()
        runtime.cudaProfilerStart()
        for _ in range(args.steps):
            step()
        runtime.cudaProfilerStop()
        out["steps_s"] = time.perf_counter() - t0
    out["process_s"] = time.perf_counter() - t_process
    print("SUMMARY " + json.dumps({k: v for k, v in out.items() if k != "rows"}), file=sys.stderr)
    print("RESULT " + json.dumps(out))


def rows_of(ds):
    stalls = [m for m in ds.data_vars if m.startswith(STALL) and m.endswith("_per_warp_active.pct")]
    rows = []
    for i in range(ds.sizes["range"]):
        row = {"kernel": str(ds["kernel"].values[i]),
               "grid": [int(ds[f"grid_{a}"].values[i]) for a in "xyz"],
               "block": [int(ds[f"block_{a}"].values[i]) for a in "xyz"],
               "gpu__time_duration.sum": float(ds["gpu__time_duration.sum"].values[i])}
        for c in ("graph_exec", "graph_launch", "graph_node"):
            if c in ds.coords:
                row[c] = int(ds[c].values[i])
        row.update({m: float(ds[m].values[i]) for m in stalls})
        rows.append(row)
    import gpuscope as gs

    td = gs.topdown(ds, check="ignore")
    for c in ("consistent", "decided", "pass_spread"):
        if c in td.coords:
            for row, v in zip(rows, td[c].values):
                row[c] = float(v)
    return rows


def fixture(prof, ds, path):
    """The rows' values as CUPTI evaluated them, with their graph ids, names and shapes and the metrics collected,
    for the CPU tests (tests/unit/test_graph_fixture.py). (The counter-data images of 90 graph kernels compress to
    16 MB: not kept.)"""
    metrics = [m for m in ds.data_vars if ds[m].dims == ("range",)]
    plan = prof._plan
    np.savez_compressed(
        path, metrics=np.array(metrics), values=np.stack([ds[m].values.astype(float) for m in metrics], axis=1),
        kernels=np.array([str(k) for k in ds["kernel"].values]),
        graph=np.stack([ds[c].values.astype(np.int64) for c in ("graph_exec", "graph_launch", "graph_node")], axis=1),
        grid=np.stack([ds[f"grid_{a}"].values for a in "xyz"], axis=1),
        block=np.stack([ds[f"block_{a}"].values for a in "xyz"], axis=1),
        pass_anchors=np.array(ds.attrs.get("pass_anchors", [])),
        collected=np.array(plan.collected if plan else metrics))


# ------------------------------------------------------------------------------------------------------------ parent
def child(workload, args, *extra):
    return [sys.executable, __file__, "work", workload, "--warmup", str(args.warmup), "--steps", str(args.steps),
            *extra]


def result_of(proc):
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"no result (rc {proc.returncode}): {proc.stderr[-1500:]}")


LOG = {"dir": None, "t0": time.perf_counter()}


def timed(cmd, name="", timeout=None):
    """Run *cmd*, its output kept in ``<out>/<name>.log``; (completed process, seconds)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        proc = subprocess.CompletedProcess(cmd, -9, _text(exc.stdout), _text(exc.stderr) + f"\n(timed out: {timeout} s)")
    wall = time.perf_counter() - t0
    if LOG["dir"] is not None and name:  # one file for every child (the GPU machine brings few files back)
        with open(LOG["dir"] / "children.log", "a") as f:
            f.write(f"=== {name}\n$ {' '.join(cmd)}\nrc {proc.returncode}, {wall:.1f} s\n{proc.stdout[-5000:]}\n"
                    f"--- stderr\n{proc.stderr[-20000:]}\n")
    print(f"[{time.perf_counter() - LOG['t0']:6.0f} s] {name or cmd[-1]}: rc {proc.returncode}, {wall:.1f} s",
          flush=True)
    return proc, wall


def _text(b):
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def run_ncu(ncu, metrics, cmd, name, timeout):
    full = [ncu, "--metrics", ",".join(metrics), "--graph-profiling", "node", "--csv", "--page", "raw",
            "--clock-control", "none", "--cache-control", "none", "--profile-from-start", "off", *cmd]
    proc, wall = timed(full, name, timeout)
    from short_kernels import ncu_rows

    rows = [{"kernel": r["Kernel Name"], "grid": _dims(r.get("Grid Size")), "block": _dims(r.get("Block Size")),
             **values} for r, values in ncu_rows(proc, metrics)]
    return {"rows": rows, "wall_s": wall, "cmd": " ".join(full[:-len(cmd)] + ["python3", *cmd[1:]])}


def _dims(text):
    try:
        return [int(v) for v in (text or "").strip("()").split(",")]
    except ValueError:
        return None


def match(ours, ref):
    """Index pairs (ours, ref): the longest common run of launch shapes (grid, block) in order of appearance
    (difflib), names aside: ncu names a kernel by its demangled signature, gpuscope by its short name."""
    import difflib

    def shapes(rows):
        return [(tuple(r["grid"] or ()), tuple(r["block"] or ())) for r in rows]

    blocks = difflib.SequenceMatcher(a=shapes(ours), b=shapes(ref), autojunk=False).get_matching_blocks()
    return [(b.a + k, b.b + k) for b in blocks for k in range(b.size)]


def shares(rows, reasons, normalised):
    s = np.array([[r.get(STALL + x + "_per_warp_active.pct", np.nan) for x in reasons] for r in rows])
    return 100 * s / np.nansum(s, axis=1, keepdims=True) if normalised else s


def agreement(ours, ncu1, ncu2, reasons):
    pairs = match(ours, ncu1)
    pairs2 = dict(match(ncu2, ncu1))  # ncu_2 row -> ncu_1 row
    back = {j: i for i, j in pairs2.items()}
    dur = np.array([ncu1[j]["gpu__time_duration.sum"] for _, j in pairs]) / 1e3
    out = {"matched": len(pairs), "ours": len(ours), "ncu": len(ncu1)}
    for normalised in (True, False):
        a = shares([ours[i] for i, _ in pairs], reasons, normalised)
        b = shares([ncu1[j] for _, j in pairs], reasons, normalised)
        c = shares([ncu2[back[j]] if j in back else {} for _, j in pairs], reasons, normalised)
        diff, yard = np.nanmax(np.abs(a - b), axis=1), np.nanmax(np.abs(c - b), axis=1)
        table = {}
        for label, lo, hi in BUCKETS + (("all", 0, np.inf),):
            sel = (dur >= lo) & (dur < hi)
            if sel.any():
                table[label] = {"n": int(sel.sum()), "gpuscope": float(np.nanmedian(diff[sel])),
                                "ncu_2": float(np.nanmedian(yard[sel])), "gpuscope_p90": float(
                                    np.nanpercentile(diff[sel], 90))}
        out["over_sum" if normalised else "raw"] = table
    out["duration_ratio_median"] = float(np.median(
        [ours[i]["gpu__time_duration.sum"] / ncu1[j]["gpu__time_duration.sum"] for i, j in pairs]))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/bench_graphs"))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--workloads", default="jax,torch")
    p.add_argument("--ncu", default="ncu")
    p.add_argument("--timeout", type=float, default=240, help="seconds for each child process")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    LOG["dir"] = args.out
    import gpuscope as gs

    metrics = list(gs.metric_set("topdown").metrics)
    stalls = [m for m in metrics if m.startswith(STALL) and m.endswith("_per_warp_active.pct")]
    reasons = [m[len(STALL):-len("_per_warp_active.pct")] for m in stalls]
    ncu_metrics = [*stalls, "gpu__time_duration.sum"]
    results = {}
    for w in args.workloads.split(","):
        res = results[w] = {}
        proc, wall = timed(child(w, args), f"{w}_plain", args.timeout)
        res["plain"] = {**result_of(proc), "wall_s": wall}
        proc, wall = timed(child(w, args, "--gpuscope", "--fixture", str(args.out / f"graph_nodes_{w}_gh100.npz")),
                           f"{w}_gpuscope", args.timeout)
        res["gpuscope"] = {**result_of(proc), "wall_s": wall}
        if w == "torch":
            proc, wall = timed(child("torch-eager", args, "--gpuscope"), "torch_eager_gpuscope", args.timeout)
            res["eager_kernel_mode"] = {**result_of(proc), "wall_s": wall}
        for k in ("ncu_1", "ncu_2"):
            res[k] = run_ncu(args.ncu, ncu_metrics, child(w, args), f"{w}_{k}", args.timeout)
        res["agreement"] = agreement(res["gpuscope"]["rows"], res["ncu_1"]["rows"], res["ncu_2"]["rows"], reasons)
        fix = args.out / f"graph_nodes_{w}_gh100.npz"
        if fix.exists():  # ncu's rows beside gpuscope's, matched, for the CPU tests
            pairs = match(res["gpuscope"]["rows"], res["ncu_1"]["rows"])
            back = {j: i for i, j in match(res["ncu_2"]["rows"], res["ncu_1"]["rows"])}
            with np.load(fix) as f:
                saved = dict(f)
            saved.update(ncu_metrics=np.array(ncu_metrics), pairs=np.array(pairs),
                         ncu_1=np.array([[r[m] for m in ncu_metrics] for r in res["ncu_1"]["rows"]]),
                         ncu_2=np.array([[res["ncu_2"]["rows"][back[j]][m] if j in back else np.nan
                                          for m in ncu_metrics] for j in range(len(res["ncu_1"]["rows"]))]))
            np.savez_compressed(fix, **saved)
        (args.out / "graphs.json").write_text(json.dumps(results, indent=1))
    print_table(results)


def print_table(results):
    print("\nworkload   rows(gpuscope/ncu)  bucket      n   gpuscope  ncu_2  (largest stall-share difference, "
          "shares over their sum, median)")
    for w, res in results.items():
        a = res["agreement"]
        for label, t in a["over_sum"].items():
            print(f"{w:10s} {a['ours']:4d}/{a['ncu']:<4d}          {label:10s} {t['n']:4d} {t['gpuscope']:9.2f} "
                  f"{t['ncu_2']:6.2f}")
        g = res["gpuscope"]
        nodes = max(len(g["rows"]), 1)
        line = (f"{w:10s} cost: plain {res['plain']['wall_s']:.1f} s, gpuscope {g['wall_s']:.1f} s (session "
                f"{g['session_s']:.2f} s, {1e3 * g['session_s'] / nodes:.0f} ms a node), ncu node "
                f"{res['ncu_1']['wall_s']:.1f}/{res['ncu_2']['wall_s']:.1f} s")
        if "eager_kernel_mode" in res:
            e = res["eager_kernel_mode"]
            line += f"; eager kernel mode {1e3 * e['session_s'] / max(len(e['rows']), 1):.0f} ms a launch"
        print(line)
        rates = {}
        for c in ("decided", "consistent"):  # decided: the report's verdict; consistent: the passes agree
            flags = np.array([r.get(c, np.nan) for r in g["rows"]], dtype=float)
            time = np.array([r["gpu__time_duration.sum"] for r in g["rows"]], dtype=float)
            known = np.isfinite(flags)
            if known.any():
                share = 100 * time[known][flags[known] > 0].sum() / time[known].sum()
                rates[c] = f"{100 * flags[known].mean():.0f}% of rows, {share:.0f}% of GPU time"
            else:
                rates[c] = "-"
        print(f"{w:10s} {a['matched']} of {a['ours']} rows matched to ncu's {a['ncu']}; duration gpuscope/ncu median "
              f"{a['duration_ratio_median']:.3f}; with a verdict (decided) {rates['decided']}; passes agreeing "
              f"(consistent) {rates['consistent']}; attrs {g['attrs']}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "work":
        ap = argparse.ArgumentParser()
        ap.add_argument("cmd")
        ap.add_argument("workload", choices=["jax", "torch", "torch-eager"])
        ap.add_argument("--warmup", type=int, default=5)
        ap.add_argument("--steps", type=int, default=3)
        ap.add_argument("--gpuscope", action="store_true")
        ap.add_argument("--fixture")
        work(ap.parse_args())
    else:
        main()
