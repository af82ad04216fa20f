"""Probe: is the warp-state gap of Hopper's cuBLAS GEMMs their ``gmma`` stalls, and what does collecting them buy
(issue 51)?

cuBLAS's ``nvjet`` GEMMs (warpgroup MMA on the tensor cores) show 78-84% warp-state coverage on the H200, in gpuscope
and in ncu alike (``tests/fixtures/range/graph_nodes_torch_gh100.npz``): the ``topdown`` set's 18 stall reasons miss
a fifth of their warp-active cycles, so their level-2 verdict is left undecided where the two leading nodes are
closer than that. ``gmma`` is an optional reason on CC 9.0 (``gpuscope.metrics.topdown.required_metrics("9.0",
optional=True)``), not in the set: it costs an eighth pass on GH100. This runs the transformer step of
``benchmarks/short_kernels.py`` (69 launches, nvjet GEMMs among elementwise kernels) in kernel-mode sessions of one
step each: ``topdown``, ``topdown`` with the gmma metric, ``topdown`` again (the set's own run-to-run difference),
and prints per session the passes, the GPU time and launches with a verdict (``decided``), the GEMMs' coverage and
verdicts; saves the Datasets under ``--out``.

    source tests/gpu/device_env.sh; python3 probes/probe_gmma_coverage.py --out $OUT/gmma
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GMMA = "smsp__warp_issue_stalled_gmma_per_warp_active.pct"


def session(gs, work, metrics):
    t0 = time.perf_counter()
    with gs.Profiler(metrics=metrics, mode="kernel") as prof:
        work.step()
    ds = prof.dataset
    return ds, time.perf_counter() - t0, prof.passes


def summary(gs, name, ds, seconds, passes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        td = gs.topdown(ds, check="ignore")
    dur = ds["gpu__time_duration.sum"].values.astype(float)
    decided = td["decided"].values.astype(bool)
    cover = td["warp_state_coverage"].values.astype(float)
    kernels = ds["kernel"].values.astype(str)
    gemm = np.array(["nvjet" in k or "gemm" in k.lower() for k in kernels])
    level2 = [n for n in td.data_vars if td[n].attrs.get("level") == 2]
    lead = np.array(level2)[np.argmax(np.stack([td[n].values for n in level2]), axis=0)]
    print(f"{name}: {passes} passes, {len(dur)} launches, {seconds:.1f} s; verdict on "
          f"{100 * dur[decided].sum() / dur.sum():.1f}% of GPU time, {100 * decided.mean():.0f}% of launches; "
          f"coverage median {np.median(cover):.1f}%")
    if gemm.any():
        print(f"  GEMMs: {gemm.sum()} launches, {100 * dur[gemm].sum() / dur.sum():.0f}% of GPU time; coverage "
              f"{np.round(cover[gemm], 1).tolist()}; decided {decided[gemm].astype(int).tolist()}")
        print(f"  GEMMs' leading level-2 node: {lead[gemm].tolist()}")
        if GMMA in ds:
            print(f"  GEMMs' gmma share (% of warp-active cycles): {np.round(ds[GMMA].values[gemm], 1).tolist()}")
    return {"decided_time": dur[decided].sum() / dur.sum(), "lead": lead, "gemm": gemm}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("gmma"))
    args = p.parse_args(argv)
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    import gpuscope as gs
    from short_kernels import TransformerWork

    args.out.mkdir(parents=True, exist_ok=True)
    work = TransformerWork()
    work.step()
    work.step()
    session(gs, work, "topdown")  # the first session's set-up
    results = {}
    for name, metrics in (("topdown", "topdown"), ("topdown+gmma", ["topdown", GMMA]), ("topdown_again", "topdown")):
        try:
            ds, seconds, passes = session(gs, work, metrics)
            gs.save_dataset(ds, args.out / f"transformer_{name}_gh100.nc")
            results[name] = summary(gs, name, ds, seconds, passes)
        except Exception as exc:  # one failing session must not take the others
            print(f"{name}: {type(exc).__name__}: {exc}")
    if {"topdown", "topdown+gmma"} <= results.keys():
        a, b = results["topdown"], results["topdown+gmma"]
        if len(a["lead"]) == len(b["lead"]):
            changed = np.flatnonzero(a["lead"] != b["lead"])
            print(f"leading level-2 node changed on {len(changed)} launches with gmma: "
                  f"{[(int(i), a['lead'][i], b['lead'][i]) for i in changed][:12]}")


if __name__ == "__main__":
    main()
