"""Stall breakdowns of short library kernels against Nsight Compute, launch by launch, by kernel length.

Run on the GPU machine from the repository root (PyTorch and CuPy are installed there; they are test workloads,
not gpuscope dependencies):

    source tests/gpu/device_env.sh; python3 benchmarks/bench_stalls_vs_ncu.py --out $OUT/stalls

The workload is :class:`short_kernels.Work` (``benchmarks/short_kernels.py``): a PyTorch training step (MLP block,
bf16 autocast, fused AdamW), CuPy 1 M-element elementwise kernels, a reduction and a small GEMM, and two long Numba
kernels; ``--reps`` steps after two warm-up steps. gpuscope collects the ``topdown`` set in kernel mode and in
iteration mode, each with its consistent pass plan (the default) and with CUPTI's own schedule
(``pass_groups="cupti"``, what gpuscope did before), and in kernel mode with Nsight Compute's own pass layout too
(``pass_groups="ncu"``);
``ncu --clock-control none --cache-control none`` collects the same metrics on the same launches, twice.
Per launch: the largest difference over the 18 ``*_per_warp_active.pct`` stall shares (percentage points), the sum
of the shares, and the level-2 verdict of the Top-Down, against ``ncu_1``; ``ncu_2`` against ``ncu_1`` is the
yardstick. Writes ``stalls.json`` (every row) and ``fixture_*.npz`` (one rep's CuPy and Numba launches with
``max_ranges=8``: the counter-data image, config and metric lists, for CPU tests), and prints the table.
A kernel-mode session made first and thrown away makes every measured session a later one of the process (the first
costs more). ``--only-kernel`` runs kernel mode (plan, CUPTI's schedule and ncu's layout) and ncu's kernel replay
only; ``--layout FILE`` adds a kernel-mode run with pass groups of raw counters read from a JSON file
(``benchmarks/layouts/plan8_gh100.json``: the 8-pass plan gpuscope collected before its warm-up pass), its shares
made as ncu makes its own; ``--rounds N`` runs the kernel-mode sessions N times, interleaved, to tell a change from
the rounds' own spread; ``--rounds-fixture STALLS_JSON NPZ`` (no GPU) writes such a run's CPU fixture.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from short_kernels import PCT, REASONS, ImageTap, Work, run_ncu, session  # noqa: E402

BUCKETS = (("< 10 us", 0, 10), ("10-50 us", 10, 50), (">= 50 us", 50, np.inf))


def collect(work, reps, metrics, mode, pass_groups):
    import gpuscope as gs

    t0 = time.perf_counter()
    with gs.Profiler(metrics=metrics, mode=mode, pass_groups=pass_groups) as prof:
        for _ in range(reps + (prof.passes + 1 if mode == "iteration" else 0)):
            work.step()
            if mode == "iteration":
                prof.step()
    ds = prof.dataset
    wall = time.perf_counter() - t0
    if "passes_from_earlier_group" in ds.coords:  # iteration mode: the complete pass group (one step's launches);
        # a trailing group of the last steps, completed from it, repeats its stall counts
        ds = ds.isel(range=np.flatnonzero(ds["passes_from_earlier_group"].values == 0))
    rows = [{"kernel": str(k)} for k in ds["kernel"].values]
    from gpuscope._gpu.pass_plan import WARMUP_ANCHOR

    anchors = [a for a in ds.attrs.get("pass_anchors", []) if a in ds and a not in metrics]
    warmup = [WARMUP_ANCHOR] if WARMUP_ANCHOR in ds and WARMUP_ANCHOR not in metrics else []
    for m in [*metrics, *anchors, *warmup]:
        for row, v in zip(rows, ds[m].values):
            row[m] = float(v)
    td = gs.topdown(ds, check="ignore")
    for c in ("pass_spread", "consistent"):
        if c in td.coords:
            for row, v in zip(rows, td[c].values):
                row[c] = float(v)
    return {"rows": rows, "wall_s": wall, "passes": prof.passes, "pass_plan": ds.attrs.get("pass_plan", ""),
            "launches": len(rows), "pass_anchors": anchors}


def collect_layout(work, reps, groups):
    """Kernel mode with *groups* (raw counters, one pass each, in pass order: ``--layout``), the set's values made
    from them as ncu makes its own: each share its stall counter over ``smsp__warps_active.sum`` (else
    ``sm__warps_active.sum``, where the groups hold that instead: an earlier plan of gpuscope's), whichever pass
    each came from."""
    raw = list(dict.fromkeys(m for g in groups for m in g))
    anchor = "smsp__warps_active.sum" if "smsp__warps_active.sum" in raw else "sm__warps_active.sum"
    res = session(work, reps, raw, groups)
    rows = []
    for v in res["rows"]:
        row = {"kernel": v["kernel"], "gpu__time_duration.sum": v["gpu__time_duration.sum"],
               "sm__cycles_elapsed.max": v["sm__cycles_elapsed.max"],
               "smsp__inst_executed.avg.per_cycle_active": v["smsp__inst_executed.sum"] / v["smsp__cycles_active.sum"],
               "smsp__inst_issued.avg.per_cycle_active": v["smsp__inst_issued.sum"] / v["smsp__cycles_active.sum"],
               "smsp__thread_inst_executed_per_inst_executed.ratio":
                   v["smsp__thread_inst_executed.sum"] / v["smsp__inst_executed.sum"]}
        for r in REASONS:
            row[PCT.format(r)] = 100 * v[f"smsp__warps_issue_stalled_{r}.sum"] / v[anchor]
        rows.append(row)
    return {"rows": rows, "wall_s": res["wall_s"], "passes": res["passes"], "launches": len(rows), "groups": groups}


def fixture(work, metrics, pass_groups, path):
    """One rep's CuPy and Numba launches in kernel mode, the image kept for the CPU tests."""
    import gpuscope as gs

    with ImageTap() as tap:
        with gs.Profiler(metrics=metrics, mode="kernel", pass_groups=pass_groups, max_ranges=8,
                         kernels="regex:cupy|DeviceReduce|gemm|stream|fma") as prof:
            work.step()
        ds = prof.dataset
    plan = prof._plan
    metrics = list(plan.requested) if plan else metrics  # with the pass anchors
    np.savez_compressed(path, image=tap.images[-1], config=np.asarray(prof._config),
                        metrics=np.array(metrics), collected=np.array(plan.collected if plan else metrics),
                        kernels=np.array([str(k) for k in ds["kernel"].values]),
                        values=np.array([[float(ds[m].values[i]) for m in metrics] for i in range(ds.sizes["range"])]),
                        groups=np.array(["|".join(g) for g in (plan.groups if plan else prof._groups)]))
    return len(tap.images)


def collect_pc(work, reps, period=2**10):
    """The stall split per kernel from PC samples (what fast Top-Down reads), over *reps* steps."""
    import gpuscope as gs
    from gpuscope._pc_sampling.fast import stall_percentages

    t0 = time.perf_counter()
    with gs.pc_sample(period=period) as pcs:
        for _ in range(reps):
            work.step()
    pc = pcs.dataset
    wall = time.perf_counter() - t0
    st = stall_percentages(pc)
    samples = pc["kernel_samples"].sum("stall_reason")
    kernels = {}
    for k in st["kernel"].values.tolist():
        kernels[str(k)] = {PCT.format(r): float(st[PCT.format(r)].sel(kernel=k)) for r in REASONS}
        kernels[str(k)]["samples"] = int(samples.sel(kernel=k))
    return {"kernels": kernels, "wall_s": wall, "total_samples": int(pc.attrs.get("total_samples", 0)),
            "dropped_samples": int(pc.attrs.get("dropped_samples", 0)),
            "hardware_buffer_full": int(pc.attrs.get("hardware_buffer_full", 0))}


def compare_per_kernel(results, names_from="kernel_plan", refs=("ncu_1", "ncu_2")):
    """PC-sampled stall shares per kernel against ncu's, each kernel's launches averaged (ncu's rows are named by
    the kernel-mode session's rows, launch for launch), by the kernel's mean duration."""
    from gpuscope._schema.names import match_kernel

    pc = results.get("pc", {}).get("kernels")
    named = results.get(names_from, {}).get("rows")
    if not pc or not named:
        return {}
    out = {}
    per_ref = {}
    for ref in refs:
        rows = results.get(ref, {}).get("rows")
        if not rows or len(rows) != len(named):
            continue
        groups = {}
        for r, g in zip(rows, named):
            groups.setdefault(g["kernel"], []).append(r)
        per_ref[ref] = {k: ({PCT.format(x): float(np.mean([r[PCT.format(x)] for r in v])) for x in REASONS},
                            float(np.mean([r["gpu__time_duration.sum"] for r in v])) / 1e3) for k, v in groups.items()}
    if refs[0] not in per_ref:
        return {}
    base = per_ref[refs[0]]
    sampled = list(pc)
    diffs = {"pc": [], refs[1]: []}
    for k, (shares, dur) in base.items():
        hit = k if k in pc else match_kernel(k, sampled)
        if hit is None:
            continue
        d = max(abs(pc[hit][m] - shares[m]) for m in shares)
        diffs["pc"].append((dur, d, pc[hit]["samples"], k))
        if refs[1] in per_ref and k in per_ref[refs[1]]:
            other = per_ref[refs[1]][k][0]
            diffs[refs[1]].append((dur, max(abs(other[m] - shares[m]) for m in shares), 0, k))
    for name, items in diffs.items():
        entry = {"kernels": len(items)}
        for label, lo, hi in BUCKETS:
            sel = [d for dur, d, _, _ in items if lo <= dur < hi]
            if sel:
                entry[label] = {"n": len(sel), "median_max_diff": float(np.median(sel)),
                                "max_max_diff": float(max(sel))}
        out[name] = entry
    out["pc_unmatched"] = sorted(set(base) - {k for _, _, _, k in diffs["pc"]})
    out["pc_samples_per_kernel_median"] = float(np.median([s for _, _, s, _ in diffs["pc"]])) if diffs["pc"] else 0
    return out


def _topdown(values: dict):
    """:func:`gpuscope.topdown` of *values* (metric name -> per-launch values, CC 9.0), its warnings silenced (short
    launches warn of their coverage, gpuscope's and ncu's alike)."""
    import warnings

    import xarray as xr

    import gpuscope as gs

    ds = xr.Dataset({m: ("range", np.asarray(v, dtype=float)) for m, v in values.items()},
                    attrs={"compute_capability": "9.0"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gs.topdown(ds, check="ignore")


def verdicts(rows, metrics):
    from gpuscope._results.report_topdown import _verdict

    td = _topdown({m: [r[m] for r in rows] for m in metrics})
    names = [n for n in td.data_vars if "level" in td[n].attrs]
    return [_verdict({n: float(td[n].values[i]) for n in names})[0] for i in range(len(rows))]


def topdown_nodes(values: dict):
    """The Top-Down nodes of each launch (:func:`gpuscope.topdown`; percent of peak issue slots), by level:
    ``{level: (names, array launches x nodes)}``, from *values* (metric name -> per-launch array, CC 9.0)."""
    td = _topdown(values)
    out = {}
    for level in (1, 2, 3):
        names = [n for n in td.data_vars if td[n].attrs.get("level") == level]
        out[level] = (names, np.stack([td[n].values for n in names], axis=1))
    return out


def node_differences(ours: dict, ref: dict, other: dict, duration_us) -> dict:
    """The Top-Down as a user reads it, against the same Top-Down of ncu's values: per level and length bucket,
    the median over launches of the largest node difference (points of peak issue slots) from *ref*'s nodes, for
    *ours* and for *other* (a second ncu run: the yardstick). Each is metric name -> per-launch array."""
    mine, base, yard = topdown_nodes(ours), topdown_nodes(ref), topdown_nodes(other)
    duration_us = np.asarray(duration_us, dtype=float)
    table = {}
    for level, (names, nodes) in base.items():
        table[level] = {}
        for label, lo, hi in BUCKETS:
            sel = (duration_us >= lo) & (duration_us < hi)
            if not sel.any():
                continue
            largest = lambda a: float(np.median(np.nanmax(np.abs(a[sel] - nodes[sel]), axis=1)))  # noqa: E731
            table[level][label] = {"n": int(sel.sum()), "ours": largest(mine[level][1]),
                                   "ncu": largest(yard[level][1])}
    return table


def nodes_from_fixture(path) -> dict:
    """:func:`node_differences` of a recording made by :func:`fixture` (``values`` against ``ncu_1``, ``ncu_2``
    the yardstick; an iteration-mode recording against ncu's application replay, ``ncu_app_1`` and ``ncu_app_2``;
    lengths from the first ncu run's durations), with no GPU."""
    f = np.load(path)
    ours = {str(m): f["values"][:, i] for i, m in enumerate(f["metrics"])}
    names = [str(m) for m in f["ncu_metrics"]]
    runs = ("ncu_1", "ncu_2") if "ncu_1" in f.files else ("ncu_app_1", "ncu_app_2")
    ncu = [{m: f[run][:, i] for i, m in enumerate(names)} for run in runs]
    return node_differences(ours, ncu[0], ncu[1], ncu[0]["gpu__time_duration.sum"] / 1e3)


def shares(rows):
    """The 18 stall shares of each row (launches x :data:`REASONS`, percent)."""
    return np.array([[r[PCT.format(x)] for x in REASONS] for r in rows])


def compare(results, metrics, ref_name="ncu_1", names=None):
    """Per run (all but the references, or *names*) and duration bucket, against the rows of *ref_name*."""
    ref = results[ref_name]["rows"]
    dur = np.array([r["gpu__time_duration.sum"] for r in ref]) / 1e3
    base = shares(ref)
    ref_verdict = verdicts(ref, metrics)
    table = {}
    ref_sum = np.nansum(base, axis=1)
    for name, res in results.items():
        if "rows" not in res or name == ref_name or (names is not None and name not in names) \
                or (names is None and name.startswith("ncu_app")):
            continue
        rows = res["rows"]
        n = len(rows)  # iteration mode: one step's launches, compared with ncu's first step
        if n > len(ref):
            table[name] = {"error": f"{len(rows)} rows against ncu's {len(ref)}"}
            continue
        s = shares(rows)
        diff = np.nanmax(np.abs(s - base[:n]), axis=1)
        duration = np.array([r.get("gpu__time_duration.sum", np.nan) for r in rows]) / 1e3 / dur[:n]
        total = np.nansum(s, axis=1)
        verdict = verdicts(rows, metrics)
        dur_n = dur[:n]
        entry = {"launches": len(rows), "wall_s": res["wall_s"], "ms_per_launch": 1e3 * res["wall_s"] / len(rows)}
        consistent = np.array([bool(r.get("consistent", True)) for r in rows])
        # ncu's own shares add up (within 100 +/- 5) on these launches: its stall counters and its warp-active
        # count agree with each other there, so a difference from ncu is not ncu's own pass inconsistency
        ncu_ok = np.abs(ref_sum[:n] - 100) <= 5
        for label, lo, hi in BUCKETS:
            sel = (dur_n >= lo) & (dur_n < hi)
            if sel.any():
                entry[label] = {"n": int(sel.sum()), "median_max_diff": float(np.median(diff[sel])),
                                "max_max_diff": float(np.max(diff[sel])), "sum_median": float(np.median(total[sel])),
                                "sum_within_5": float(np.mean(np.abs(total[sel] - 100) <= 5)),
                                "duration_ratio_median": float(np.nanmedian(duration[sel])),
                                "verdict_agrees": float(np.mean([verdict[i] == ref_verdict[i]
                                                                 for i in np.flatnonzero(sel)]))}
                ok_ncu = sel & ncu_ok
                entry[label].update(
                    ncu_self_consistent=int(ok_ncu.sum()),
                    median_max_diff_ncu_self_consistent=float(np.median(diff[ok_ncu])) if ok_ncu.any() else None,
                    median_max_diff_ncu_inconsistent=float(np.median(diff[sel & ~ncu_ok]))
                    if (sel & ~ncu_ok).any() else None)
                if "consistent" in rows[0]:  # the launches gpuscope gives a verdict for, and the others
                    ok, bad = sel & consistent, sel & ~consistent
                    entry[label].update(
                        consistent=int(ok.sum()),
                        median_max_diff_consistent=float(np.median(diff[ok])) if ok.any() else None,
                        median_max_diff_inconsistent=float(np.median(diff[bad])) if bad.any() else None,
                        verdict_agrees_consistent=float(np.mean([verdict[i] == ref_verdict[i]
                                                                 for i in np.flatnonzero(ok)])) if ok.any() else None)
        table[name] = entry
    return table


def print_table(table, ref="ncu_1"):
    print(f"against {ref}:")
    print("| run | bucket | launches | median max diff (pp) | max | shares sum, median | within 100 +/- 5 | "
          f"verdict = {ref} | duration / {ref}'s, median |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, entry in table.items():
        for label, _, _ in BUCKETS:
            b = entry.get(label)
            if b:
                print(f"| {name} | {label} | {b['n']} | {b['median_max_diff']:.1f} | {b['max_max_diff']:.1f} | "
                      f"{b['sum_median']:.1f} | {100 * b['sum_within_5']:.0f}% | {100 * b['verdict_agrees']:.0f}% | "
                      f"{b.get('duration_ratio_median', float('nan')):.3f} |")
    print("launches gpuscope calls consistent (pass_spread <= 10%, shares within 100 +/- 5%), and the others:")
    for name, entry in table.items():
        for label, _, _ in BUCKETS:
            b = entry.get(label)
            if b and "consistent" in b:
                fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
                pct = lambda v: None if v is None else 100 * v  # noqa: E731
                print(f"  {name} {label}: {b['consistent']} of {b['n']} consistent, median max diff "
                      f"{fmt(b['median_max_diff_consistent'])} (the others {fmt(b['median_max_diff_inconsistent'])})"
                      f", verdict = {ref} on consistent {fmt(pct(b['verdict_agrees_consistent']))}%")
    print(f"launches where {ref}'s own shares sum to 100 +/- 5, and the others:")
    for name, entry in table.items():
        for label, _, _ in BUCKETS:
            b = entry.get(label)
            if b and "ncu_self_consistent" in b:
                fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
                print(f"  {name} {label}: {b['ncu_self_consistent']} of {b['n']}, median max diff "
                      f"{fmt(b['median_max_diff_ncu_self_consistent'])} (the others "
                      f"{fmt(b['median_max_diff_ncu_inconsistent'])})")
    print("cost (wall of the whole session / launches):")
    for name, entry in table.items():
        if "ms_per_launch" in entry:
            print(f"  {name}: {entry['wall_s']:.1f} s, {entry['ms_per_launch']:.1f} ms/launch")


def rounds_fixture(stalls_json, path):
    """The kernel-mode rounds of a ``--rounds 2 --layout benchmarks/layouts/plan8_gh100.json`` run (its
    ``stalls.json``) as a CPU fixture: per run and round the 18 shares of every launch, ncu's twice, and the plan's
    first round whole (values, anchors, ``consistent``) for ``gs.topdown``."""
    from gpuscope._gpu.pass_plan import WARMUP_ANCHOR

    results = json.loads(Path(stalls_json).read_text())
    runs = {"plan": "kernel_plan", "plan8": "kernel_layout_plan8_gh100", "ncu_layout": "kernel_ncu",
            "cupti": "kernel_cupti"}
    arrays = {f"{short}_{k}": shares(results[name + ("" if k == 1 else "_r2")]["rows"])
              for short, name in runs.items() for k in (1, 2)}
    plan = results["kernel_plan"]["rows"]
    metrics = [m for m in plan[0] if m not in ("kernel", "pass_spread", "consistent")]
    np.savez_compressed(
        path, reasons=np.array(REASONS), kernels=np.array([r["kernel"] for r in plan]),
        duration_ns=np.array([r["gpu__time_duration.sum"] for r in results["ncu_1"]["rows"]]),
        ncu_1=shares(results["ncu_1"]["rows"]), ncu_2=shares(results["ncu_2"]["rows"]), **arrays,
        plan_metrics=np.array(metrics), plan_values=np.array([[r[m] for m in metrics] for r in plan]),
        plan_anchors=np.array([a for a in results["kernel_plan"]["pass_anchors"] if a != WARMUP_ANCHOR]),
        warmup_anchor=WARMUP_ANCHOR,
        ms_per_launch=np.array([[1e3 * results[n + t]["wall_s"] / results[n + t]["launches"] for t in ("", "_r2")]
                                for n in runs.values()]), cost_runs=np.array(list(runs)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--out", default="stalls_out")
    ap.add_argument("--app-runs", type=int, default=2, help="ncu runs with --replay-mode application (0: none)")
    ap.add_argument("--layout", action="append", default=[], help="a JSON file of pass groups of raw counters in "
                    "pass order: one more kernel-mode run, kernel_layout_<file's stem>, its shares made as ncu makes "
                    "its own (probes/probe_ncu_passes.py); may be given more than once")
    ap.add_argument("--rounds", type=int, default=1, help="run the kernel-mode sessions (plan, CUPTI's schedule, "
                    "ncu's layout, each --layout) this many times, interleaved")
    ap.add_argument("--only-kernel", action="store_true", help="kernel mode and ncu's kernel replay only (no "
                    "iteration mode, PC sampling, fixtures or application replay)")
    ap.add_argument("--nodes", metavar="FIXTURE", help="no GPU: print the Top-Down nodes of a recording "
                    "(tests/fixtures/range/stalls_vs_ncu_gh100.npz) against ncu's values through the same Top-Down")
    ap.add_argument("--rounds-fixture", nargs=2, metavar=("STALLS_JSON", "NPZ"), help="no GPU: write the CPU fixture "
                    "of a --rounds 2 run's stalls.json (tests/fixtures/range/plan7_rounds_gh100.npz)")
    args = ap.parse_args()
    if args.rounds_fixture:
        rounds_fixture(*args.rounds_fixture)
        return
    if args.nodes:
        for level, buckets in nodes_from_fixture(args.nodes).items():
            print(f"level {level}: " + "; ".join(f"{label} ({b['n']}): gpuscope {b['ours']:.2f}, ncu against itself "
                                                  f"{b['ncu']:.2f}" for label, b in buckets.items()))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import gpuscope as gs

    metrics = list(gs.metric_set("topdown").metrics)
    work = Work()
    work.step()
    work.step()
    # a first session in the process costs more per launch (CUPTI's first kernel replays): one, thrown away, so
    # that every session below is a later one and their costs compare
    t0 = time.perf_counter()
    warm = collect(work, 1, metrics, "kernel", None)
    print(f"warm-up session: {warm['launches']} rows, {time.perf_counter() - t0:.1f} s", flush=True)
    results = {}

    def run(name, make):
        try:
            results[name] = res = make()
            print(f"{name}: {res['launches']} rows, {res['passes']} passes, {res['wall_s']:.1f} s", flush=True)
        except Exception as exc:
            results[name] = {"error": repr(exc)}
            print(f"{name}: {exc!r}", flush=True)

    # --rounds N: the kernel-mode runs N times, interleaved (a process's history moves short kernels' shares, and
    # a session's cost depends on what ran before it): the later rounds' names end in _r2, _r3, ...
    for k in range(1, args.rounds + 1):
        tail = "" if k == 1 else f"_r{k}"
        for label, groups in (("plan", None), ("cupti", "cupti"), ("ncu", "ncu")):
            run(f"kernel_{label}{tail}", lambda groups=groups: collect(work, args.reps, metrics, "kernel", groups))
        for layout in map(Path, args.layout):
            run(f"kernel_layout_{layout.stem}{tail}",
                lambda layout=layout: collect_layout(work, args.reps, json.loads(layout.read_text())))
    for label, groups in () if args.only_kernel else (("plan", None), ("cupti", "cupti")):
        run(f"iteration_{label}", lambda groups=groups: collect(work, args.reps, metrics, "iteration", groups))
    if args.only_kernel:
        args.app_runs = 0
    try:
        if args.only_kernel:
            raise RuntimeError("--only-kernel")
        results["pc"] = collect_pc(work, args.reps)
        print(f"pc: {len(results['pc']['kernels'])} kernels, {results['pc']['total_samples']} samples, "
              f"{results['pc']['wall_s']:.1f} s", flush=True)
    except Exception as exc:
        results["pc"] = {"error": repr(exc)}
        print(f"pc: {exc!r}", flush=True)
    for label, groups in () if args.only_kernel else (("plan", None), ("cupti", "cupti")):
        try:
            fixture(work, metrics, groups, out / f"fixture_{label}.npz")
        except Exception as exc:
            print(f"fixture {label}: {exc!r}", flush=True)
    gs.release()  # the kept profiler would make ncu's child wait for the counters
    for k in (1, 2):
        try:
            results[f"ncu_{k}"] = run_ncu(args.ncu, metrics, args.reps)
            print(f"ncu_{k}: {len(results[f'ncu_{k}']['rows'])} rows, {results[f'ncu_{k}']['wall_s']:.1f} s",
                  flush=True)
        except Exception as exc:
            results[f"ncu_{k}"] = {"error": repr(exc)}
            print(f"ncu_{k}: {exc!r}", flush=True)
    # iteration mode measures the program's own launches, no replay: ncu's application replay does the same
    # (each pass a run of the whole process), so it is the yardstick there; one step (--reps 1) per run
    for k in range(1, args.app_runs + 1):
        try:
            results[f"ncu_app_{k}"] = run_ncu(args.ncu, metrics, 1, extra=("--replay-mode", "application"))
            print(f"ncu_app_{k}: {len(results[f'ncu_app_{k}']['rows'])} rows, "
                  f"{results[f'ncu_app_{k}']['wall_s']:.1f} s", flush=True)
        except Exception as exc:
            results[f"ncu_app_{k}"] = {"error": repr(exc)}
            print(f"ncu_app_{k}: {exc!r}", flush=True)
    (out / "stalls.json").write_text(json.dumps(results))
    table = compare(results, metrics)
    print_table(table)
    tables = {"ncu_1": table}
    if "rows" in results.get("ncu_app_1", {}):
        app = compare(results, metrics, ref_name="ncu_app_1",
                      names=[n for n in results if n.startswith("iteration") or n == "ncu_app_2"])
        print_table(app, ref="ncu_app_1")
        tables["ncu_app_1"] = app
    # PC sampling sees the program's own launches: against ncu's kernel replay, and its application replay (whose
    # rows, one step, are named by the iteration-mode session's)
    for refs, names_from in ((("ncu_1", "ncu_2"), "kernel_plan"), (("ncu_app_1", "ncu_app_2"), "iteration_plan")):
        per_kernel = compare_per_kernel(results, names_from=names_from, refs=refs)
        tables[f"pc_per_kernel_{refs[0]}"] = per_kernel
        if not per_kernel:
            continue
        print(f"PC-sampled stall shares per kernel (fast Top-Down's split) against {refs[0]}, each kernel's launches "
              f"averaged; median samples per kernel {per_kernel['pc_samples_per_kernel_median']:.0f}, unmatched "
              f"{per_kernel['pc_unmatched']}:")
        for name in ("pc", refs[1]):
            for label, _, _ in BUCKETS:
                b = per_kernel.get(name, {}).get(label)
                if b:
                    print(f"  {name} {label}: {b['n']} kernels, median max diff {b['median_max_diff']:.1f}, "
                          f"max {b['max_max_diff']:.1f}")
    (out / "table.json").write_text(json.dumps(tables, indent=1))


if __name__ == "__main__":
    main()
