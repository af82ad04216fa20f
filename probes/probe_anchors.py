"""Probe: one warp-active counter of its own in every stall pass, so that each pass's shares have their own denominator.

Run on the GPU machine from the repository root:

    source tests/gpu/device_env.sh; python3 probes/probe_anchors.py --out $OUT/anchors

GH100 has several counters of active warp-cycles: ``sm__warps_active``, ``smsp__warps_active``,
``sm__warps_active_realtime``, ``sm__warps_active_shader_cs``, ``sm__warps_active_shader_cs_realtime`` and
``tpc__warps_active_shader_cs_realtime``. CUPTI evaluates a counter collected in several passes to one value, so one
counter cannot give each pass its denominator; distinct counters might. Sessions (kernel replay, the workload of
``probe_pass_consistency``):

* ``same_pass``: every anchor in one pass: do they count the same thing (ratio to ``sm__warps_active``)?
* ``per_pass``: the ``topdown`` plan with a different anchor in each stall pass (``smsp__warps_active`` in the lead
  pass): does each pass's anchor differ the way the passes do, and do the shares, each over its own pass's anchor,
  sum to 100% and agree with ncu better than over one anchor?
* ``ncu``: ``--clock-control none --cache-control none``, the ``topdown`` set and the anchors.

Writes ``anchors.json`` and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_pass_consistency import PCT, RAW, REASONS, Work, run_ncu, session  # noqa: E402

ANCHORS = ("sm__warps_active.sum", "sm__warps_active_realtime.sum", "sm__warps_active_shader_cs.sum",
           "sm__warps_active_shader_cs_realtime.sum", "tpc__warps_active_shader_cs_realtime.sum",
           "smsp__warps_active.sum")


def per_pass_groups(plan_groups):
    groups = [list(g) for g in plan_groups]
    groups[0] = groups[0] + ["smsp__warps_active.sum"]
    stall = [g for g in groups if any(m.startswith("smsp__warps_issue_stalled_") for m in g)]
    for g, a in zip(stall, ANCHORS[:5]):
        g.remove("sm__warps_active.sum")
        g.append(a)
    for g in stall[5:]:
        g.remove("sm__warps_active.sum")  # no distinct anchor left: normalised by the previous pass's
    return groups


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--out", default="anchors_out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import gpuscope as gs
    from gpuscope._gpu import metric_lists as lists

    topdown = list(gs.metric_set("topdown").metrics)
    plan = lists.consistent_plan(tuple(lists.resolve("topdown", "GH100")), "GH100")
    work = Work()
    work.step()
    work.step()
    results = {}
    same = list(ANCHORS) + ["sm__cycles_elapsed.max", "gpu__time_duration.sum"]
    results["same_pass"] = session(work, args.reps, same)
    print("same_pass", results["same_pass"]["passes"], "passes", flush=True)
    groups = per_pass_groups(plan.groups)
    flat = list(dict.fromkeys(m for g in groups for m in g))
    res = session(work, args.reps, flat, groups)
    res["groups"] = groups
    results["per_pass"] = res
    print("per_pass", res["passes"], "passes", flush=True)
    gs.release()
    results["ncu"] = run_ncu(args.ncu, topdown + list(ANCHORS), args.reps)
    results["ncu_2"] = run_ncu(args.ncu, topdown, args.reps)
    for r in results.values():
        r.pop("config", None)
    (out / "anchors.json").write_text(json.dumps(results))
    summarize(results)


def summarize(results):
    ncu = results["ncu"]["rows"]
    dur = np.array([r["gpu__time_duration.sum"] for r in ncu]) / 1e3
    buckets = (("<10", dur < 10), ("10-50", (dur >= 10) & (dur < 50)), (">=50", dur >= 50))
    same = results["same_pass"]["rows"]
    print("same pass, anchor / sm__warps_active: median [min, max] by bucket")
    for a in ANCHORS[1:]:
        r = np.array([x[a] / x["sm__warps_active.sum"] for x in same])
        print(f"  {a:42s}", "  ".join(f"{b}: {np.median(r[s]):.4f} [{r[s].min():.4f}, {r[s].max():.4f}]"
                                       for b, s in buckets if s.any()))
    for name in ("ncu",):
        r = np.array([x[a] / x["sm__warps_active.sum"] for x in results[name]["rows"] for a in ANCHORS[1:]])
        print(f"  ncu's ratios: median {np.median(r):.4f} [{r.min():.4f}, {r.max():.4f}]")
    pp = results["per_pass"]
    rows, groups = pp["rows"], pp["groups"]
    if len(rows) != len(ncu):
        print("per_pass rows", len(rows), "against ncu", len(ncu))
        return
    ref = np.array([[r[PCT.format(x)] for x in REASONS] for r in ncu])
    ref2 = np.array([[r[PCT.format(x)] for x in REASONS] for r in results["ncu_2"]["rows"]])
    anchor_of, last = {}, None
    for g in groups:
        a = next((m for m in g if m in ANCHORS), None)
        if any(m.startswith("smsp__warps_issue_stalled_") for m in g):
            last = a or last
            for m in g:
                if m.startswith("smsp__warps_issue_stalled_"):
                    anchor_of[m] = last
    print("per-pass anchors / ncu's sm__warps_active, median by bucket:")
    for a in ANCHORS:
        v = np.array([r[a] / n["sm__warps_active.sum"] for r, n in zip(rows, ncu)])
        print(f"  {a:42s}", "  ".join(f"{b}: {np.median(v[s]):.3f}" for b, s in buckets if s.any()))
    own = np.array([[100 * r[RAW.format(x)] / r[anchor_of[RAW.format(x)]] for x in REASONS] for r in rows])
    one = np.array([[100 * r[RAW.format(x)] / r["sm__warps_active.sum"] for x in REASONS] for r in rows])
    spread = np.array([np.ptp([r[a] for a in ANCHORS[:5]]) / r["sm__warps_active.sum"] for r in rows])
    print("| shares over | bucket | n | median max diff vs ncu | sum median | sum within 100+/-5 |")
    for label, s in (("own pass's anchor", own), ("sm__warps_active", one), ("ncu_2", ref2)):
        d = np.nanmax(np.abs(s - ref), axis=1)
        tot = np.nansum(s, axis=1)
        for b, sel in buckets:
            if sel.any():
                print(f"| {label} | {b} | {sel.sum()} | {np.median(d[sel]):.2f} | {np.median(tot[sel]):.1f} | "
                      f"{100 * np.mean(np.abs(tot[sel] - 100) <= 5):.0f}% |")
    for b, sel in buckets:
        if sel.any():
            print(f"anchor spread over the stall passes ({b}): median {100 * np.median(spread[sel]):.1f}% "
                  f"of sm__warps_active, max {100 * spread[sel].max():.1f}%")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "summary":
        summarize(json.loads(Path(sys.argv[2]).read_text()))
    else:
        main()
