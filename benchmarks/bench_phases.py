"""Speed and accuracy of gpuscope's phase detection: H100 recordings with true phases, and synthetic signals.

Run:  python benchmarks/bench_phases.py [--quick] [--real-only]     (CPU only)

Real recordings (``tests/fixtures/phases/``, made by ``benchmarks/record_phases.py`` on an H100, PM sampling
every 100 us): the true phases are the recording's top-level user ranges, ``<index>_<kind>``; ranges of the same
kind should get the same label. Scored per recording (:func:`score`):

* phase count: distinct labels on the samples inside the ranges, leaving out samples within ``EDGE_NS`` (2 ms)
  of a range's edges (the GPU starts work up to ~1.5 ms after the first range opens), against the number of
  kinds;
* boundaries: the true ones are the midpoints between consecutive ranges; detected change points before the
  first range's start or after the last range's end (+-``TOL_NS``) are not scored (idle before and after the
  workload); a hit is within ``TOL_NS`` (1 ms), one-to-one; F1 of hits, and each true boundary's distance to
  the nearest detected one;
* adjusted Rand index of the labels against the kinds, over every sample inside a range;
* idle: how many labels the samples of ``idle`` ranges carry.

Signals: ``d = 8`` metrics, 5-15 change points at least 3% of the length apart, Gaussian noise of sigma 1, and
each metric then given its own scale and offset (10^-3 .. 10^3) as real counters have. Two scenarios:

* ``recurring``: 4 phase prototypes with levels N(0, 1) per metric; each segment takes a prototype other than
  the previous one, so phases recur (labels are scored with the adjusted Rand index).
* ``sparse``: at each change only 2 of the 8 metrics move, by 1-2 sigma, the others stay.

A detected boundary is a hit when it lies within 1% of the length of a true one (one-to-one matching); F1 is
pooled over all trials. Timing: ``phases()`` on an xarray Dataset of 1e6 samples x 8 metrics, wall clock.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import xarray as xr

from gpuscope.metrics.phases import change_points, phases

D = 8
TOL_NS = 1e6
EDGE_NS = 2e6
ROOT = Path(__file__).resolve().parent.parent


def recordings():
    """The fixture loader module of ``tests/fixtures/phases`` (shared with the unit tests)."""
    spec = importlib.util.spec_from_file_location("phase_recordings", ROOT / "tests/fixtures/phases/recordings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def score(ds: xr.Dataset, ph: xr.Dataset, rec) -> dict:
    """Score the phases *ph* found in the recording *ds* against its true phases (see the module docstring)."""
    import gpuscope as gs

    sp = gs.spans(ds)
    t = np.asarray(ds["time"], dtype=float)
    found = t[np.asarray(ph.segment_first)[1:]]
    found = found[(found > sp["start"].min() + TOL_NS) & (found < sp["end"].max() - TOL_NS)]
    true = rec.true_boundaries_ns(ds)
    hits = matches(found, true, TOL_NS)
    precision, recall = hits / max(len(found), 1), hits / max(len(true), 1)
    err = np.array([np.abs(found - b).min() if len(found) else np.inf for b in true]) / 1e6
    labels, truth = np.asarray(ph.phase), rec.true_labels(ds)
    inside = truth >= 0
    span = np.asarray(ds["span"])[inside]
    t_end = np.asarray(ds["end_ns"], dtype=float)[inside] - float(ds.attrs["session_start_ns"])
    core = np.zeros_like(inside)
    core[inside] = (t[inside] >= sp["start"].to_numpy()[span] + EDGE_NS) & (
        t_end <= sp["end"].to_numpy()[span] - EDGE_NS)
    kinds = np.array(rec.kinds(ds))
    idle = inside.copy()
    idle[inside] = kinds[span] == "idle"
    return {
        "phases": len(np.unique(labels[core])),
        "kinds": len(np.unique(truth[core])),
        "boundaries": len(true),
        "found": len(found),
        "f1": 2 * precision * recall / max(precision + recall, 1e-12),
        "median_error_ms": float(np.median(err)) if len(err) else 0.0,
        "max_error_ms": float(err.max()) if len(err) else 0.0,
        "ari": adjusted_rand(labels[inside], truth[inside]),
        "idle_labels": len(np.unique(labels[idle])) if idle.any() else None,
    }


def real(**kwargs) -> list[tuple[str, dict]]:
    """Score :func:`phases` (with *kwargs*) on every recording."""
    rec = recordings()
    rows = []
    for name in rec.NAMES:
        ds = rec.load(name)
        rows.append((name, score(ds, phases(ds, topdown=False, **kwargs), rec)))
    return rows


def synthetic(n: int, scenario: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples (n, D), true change points, true phase label per sample."""
    k = int(rng.integers(5, 16))
    gap = max(2, int(0.03 * n))
    while True:
        cps = np.sort(rng.choice(np.arange(gap, n - gap), k, replace=False))
        if np.all(np.diff(cps) >= gap):
            break
    bounds = np.concatenate([[0], cps, [n]])
    if scenario == "recurring":
        protos = rng.normal(0.0, 1.0, (4, D))
        labels = [int(rng.integers(4))]
        for _ in range(k):
            labels.append((labels[-1] + int(rng.integers(1, 4))) % 4)
        levels = protos[labels]
    else:
        levels = np.zeros((k + 1, D))
        labels = list(range(k + 1))
        for i in range(1, k + 1):
            moved = rng.choice(D, 2, replace=False)
            levels[i] = levels[i - 1]
            levels[i, moved] += rng.uniform(1.0, 2.0, 2) * rng.choice([-1, 1], 2)
    x = np.repeat(levels, np.diff(bounds), axis=0) + rng.normal(0.0, 1.0, (n, D))
    x = x * 10.0 ** rng.uniform(-3, 3, D) + rng.uniform(-100, 100, D)
    return x, cps, np.repeat(labels, np.diff(bounds))


def matches(found: np.ndarray, true: np.ndarray, tol: float) -> int:
    """One-to-one matches within ``tol``, closest pairs first."""
    pairs = sorted((abs(int(f) - int(t)), i, j) for i, f in enumerate(found) for j, t in enumerate(true))
    used_f, used_t, hits = set(), set(), 0
    for dist, i, j in pairs:
        if dist > tol:
            break
        if i not in used_f and j not in used_t:
            used_f.add(i)
            used_t.add(j)
            hits += 1
    return hits


def adjusted_rand(a: np.ndarray, b: np.ndarray) -> float:
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1))
    np.add.at(table, (ai, bi), 1)

    def pairs(v):
        return float((v * (v - 1) / 2).sum())

    index, rows, cols, total = pairs(table), pairs(table.sum(1)), pairs(table.sum(0)), pairs(np.array([len(a)]))
    expected = rows * cols / total
    return (index - expected) / ((rows + cols) / 2 - expected)


def accuracy(n: int, scenario: str, trials: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    tp = fp = fn = 0
    aris = []
    for _ in range(trials):
        x, cps, labels = synthetic(n, scenario, rng)
        ds = xr.Dataset({f"m{i}": ("time", x[:, i]) for i in range(D)}, coords={"time": np.arange(n) * 1000})
        ph = phases(ds, topdown=False)
        found = np.asarray(ph.segment_first[1:])
        hits = matches(found, cps, 0.01 * n)
        tp, fp, fn = tp + hits, fp + len(found) - hits, fn + len(cps) - hits
        if scenario == "recurring":
            aris.append(adjusted_rand(np.asarray(ph.phase), labels))
    precision, recall = tp / max(tp + fp, 1), tp / max(tp + fn, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-12)
    return {"precision": precision, "recall": recall, "f1": f1, "ari": statistics.mean(aris) if aris else None}


def speed(n: int, repeats: int, seed: int) -> dict:
    x, _, _ = synthetic(n, "recurring", np.random.default_rng(seed))
    ds = xr.Dataset({f"m{i}": ("time", x[:, i]) for i in range(D)}, coords={"time": np.arange(n) * 1000})
    times = {"phases": [], "change_points": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        phases(ds, topdown=False)
        t1 = time.perf_counter()
        change_points(x)
        t2 = time.perf_counter()
        times["phases"].append(t1 - t0)
        times["change_points"].append(t2 - t1)
    return {k: (v[0], statistics.median(v), max(v)) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials")
    parser.add_argument("--real-only", action="store_true", help="only the H100 recordings")
    args = parser.parse_args()
    trials = {1_000: 100, 10_000: 100, 100_000: 20, 1_000_000: 5}
    if args.quick:
        trials = {n: max(2, t // 10) for n, t in trials.items()}

    print(f"# gpuscope phase detection benchmark ({platform.processor() or platform.machine()}, "
          f"numpy {np.__version__}, Python {platform.python_version()})\n")
    print("| recording | phases found / kinds | boundaries found / true | F1 (1 ms) | median / max boundary error (ms) "
          "| adjusted Rand | labels on idle |\n|---|---|---|---|---|---|---|")
    for name, r in real():
        idle = "-" if r["idle_labels"] is None else r["idle_labels"]
        print(f"| {name} | {r['phases']} / {r['kinds']} | {r['found']} / {r['boundaries']} | {r['f1']:.2f} | "
              f"{r['median_error_ms']:.2f} / {r['max_error_ms']:.2f} | {r['ari']:.3f} | {idle} |")
    if args.real_only:
        return
    print()
    print("| samples x metrics | call | first run (s) | median (s) | max (s) |\n|---|---|---|---|---|")
    for call, (first, median, worst) in speed(1_000_000, 5, seed=1).items():
        print(f"| 1e6 x {D} | {call} | {first:.3f} | {median:.3f} | {worst:.3f} |")
    print("\n| scenario | samples | trials | precision | recall | F1 (1% tolerance) | adjusted Rand (labels) |")
    print("|---|---|---|---|---|---|---|")
    for scenario in ("recurring", "sparse"):
        for n, t in trials.items():
            r = accuracy(n, scenario, t, seed=n)
            ari = f"{r['ari']:.3f}" if r["ari"] is not None else "-"
            print(f"| {scenario} | {n:.0e} | {t} | {r['precision']:.3f} | {r['recall']:.3f} | {r['f1']:.3f} | {ari} |")


if __name__ == "__main__":
    main()
