"""Speed and accuracy of gpuscope's phase detection: H100 recordings with true phases, and synthetic signals.

Run:  python benchmarks/bench_phases.py [--quick] [--real-only] [--ruptures]     (CPU only)

Real recordings (``tests/fixtures/phases/``, made by ``benchmarks/record_phases.py`` on an H100, PM sampling
every 100 us, and the shipped ``gpuscope demo`` recording, whose fma and divergent ranges are one kind; see
``tests/fixtures/phases/recordings.py``): the true phases are the recording's top-level user ranges,
``<index>_<kind>``; ranges of the same kind should get the same label. Scored per recording (:func:`score`):

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

``--ruptures`` (needs ``pip install ruptures``) compares the change-point step with ruptures' detectors
(:data:`RUPTURES`): each replaces :func:`gpuscope.metrics.phases.change_points` inside :func:`phases`, so it sees
the same standardised block means and everything around it (minimum-change pruning, placement within blocks,
labelling) stays the same. Penalties: the L2-type costs (KernelCPD ``linear``, PELT ``l2``) measure the same
squared error in noise-sigma units as gpuscope's own, so they get gpuscope's rule (:func:`default_penalty`)
times a factor; the ``rbf`` costs have other units (at most 1 per sample), so their penalty is a factor times
``log(blocks)``. The factors are swept (:data:`SWEEP`) and every row is printed; the detector tables then use the
factor that scored best on the recordings, a choice that favours ruptures. PELT finds the same optimum of the
same penalised cost as KernelCPD (both are exact), but ruptures' PELT is a Python loop (~10 s on 1000 blocks), so
it runs only at the chosen factor, to confirm that and to time it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import xarray as xr

from gpuscope.metrics import phases as phases_module
from gpuscope.metrics.phases import change_points, default_penalty, phases

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
    span = np.asarray(ds["span_index"])[inside]
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


#: ruptures detectors compared: name -> (algorithm, ruptures cost or kernel, penalty base: "l2" or "rbf").
RUPTURES = {
    "KernelCPD linear": ("KernelCPD", "linear", "l2"),
    "KernelCPD rbf": ("KernelCPD", "rbf", "rbf"),
    "PELT l2": ("Pelt", "l2", "l2"),
    "PELT rbf": ("Pelt", "rbf", "rbf"),
}
#: Penalty factors swept for ruptures' detectors (times gpuscope's rule for l2, times log(blocks) for rbf).
SWEEP = {"l2": (0.25, 0.5, 1.0, 2.0, 4.0), "rbf": (0.03, 0.1, 0.3, 1.0, 3.0)}


def ruptures_change_points(name: str, factor: float):
    """A stand-in for :func:`change_points` (same call, same result type) running a ruptures detector."""
    import ruptures as rpt

    algorithm, cost, base = RUPTURES[name]

    def detect(z, *, penalty=None, min_size=None, max_change_points=None, standardized=False):
        z = np.asarray(z, dtype=float).reshape(len(z), -1)
        n, d = z.shape
        if d == 0 or n < 4:
            return np.zeros(0, dtype=np.int64)
        size = max(2, n // 1000) if min_size is None else int(min_size)
        pen = factor * (default_penalty(n, d) if base == "l2" else np.log(n))
        algo = (rpt.KernelCPD(kernel=cost, min_size=size) if algorithm == "KernelCPD"
                else rpt.Pelt(model=cost, min_size=size, jump=1))
        cps = np.asarray(algo.fit(z).predict(pen=pen)[:-1], dtype=np.int64)  # ruptures ends with n
        return cps

    return detect


@contextlib.contextmanager
def detector(name: str | None, factor: float = 1.0):
    """Run :func:`phases` with the ruptures detector *name* (None: gpuscope's own) in place of change_points."""
    if name is None:
        yield
        return
    own = phases_module.change_points
    phases_module.change_points = ruptures_change_points(name, factor)
    try:
        yield
    finally:
        phases_module.change_points = own


def real(**kwargs) -> list[tuple[str, dict]]:
    """Score :func:`phases` (with *kwargs*) on every recording."""
    rec = recordings()
    rows = []
    for name in rec.SCORED:
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


def summary(rows: list[tuple[str, dict]]) -> dict:
    """Scores of one detector over the recordings."""
    r = [row for _, row in rows]
    return {"ok": sum(x["phases"] == x["kinds"] and x["max_error_ms"] <= TOL_NS / 1e6 for x in r),
            "exact": sum(x["phases"] == x["kinds"] for x in r), "f1_mean": statistics.mean(x["f1"] for x in r),
            "f1_min": min(x["f1"] for x in r), "max_error_ms": max(x["max_error_ms"] for x in r),
            "ari_mean": statistics.mean(x["ari"] for x in r), "idle": [x["idle_labels"] for x in r if x["idle_labels"]]}


def compare_ruptures(trials: dict[int, int]) -> None:
    """Print the sweep, the per-recording scores, the synthetic scores and the timing of every detector."""
    print("\n## ruptures' detectors in place of gpuscope's change_points (same block means, pruning, labels)\n")
    print("| detector | penalty factor | recordings with exact count and all boundaries within 1 ms | exact phase "
          "counts | mean / min F1 (1 ms) | max boundary error (ms) | mean adjusted Rand |\n|---|---|---|---|---|---|---|")

    def row(label, factor, s):
        print(f"| {label} | {factor:g} | {s['ok']} | {s['exact']} | {s['f1_mean']:.2f} / {s['f1_min']:.2f} | "
              f"{s['max_error_ms']:.2f} | {s['ari_mean']:.3f} |")

    row("gpuscope binary segmentation", 1, summary(real()))
    chosen = {}
    for name, (algorithm, _, base) in RUPTURES.items():
        if algorithm == "Pelt":
            continue
        best = None
        for factor in SWEEP[base]:
            with detector(name, factor):
                s = summary(real())
            row(name, factor, s)
            key = (s["ok"], s["f1_mean"], s["ari_mean"])
            if best is None or key > best[0]:
                best = (key, factor)
        chosen[base] = best[1]
    print(f"\nChosen factors (best on the recordings): {chosen}\n")
    # (label, detector, factor): gpuscope's own; KernelCPD linear with gpuscope's own rule; each at its best factor
    runs = [("gpuscope", None, 1.0), ("KernelCPD linear x1", "KernelCPD linear", 1.0)]
    runs += [(f"{name} x{chosen[base]:g}", name, chosen[base]) for name, (_, _, base) in RUPTURES.items()]
    print("| recording | " + " | ".join(label for label, _, _ in runs) + " |\n|---|" + "---|" * len(runs))
    per = {}
    for label, name, factor in runs:
        with detector(name, factor):
            per[label] = dict(real())
    for rec in recordings().SCORED:
        cells = [f"{per[lb][rec]['phases']}/{per[lb][rec]['kinds']}, F1 {per[lb][rec]['f1']:.2f}, "
                 f"{per[lb][rec]['max_error_ms']:.2f} ms" for lb, _, _ in runs]
        print(f"| {rec} | " + " | ".join(cells) + " |")
    fast = [r for r in runs if not (r[1] or "").startswith("PELT")]  # PELT: KernelCPD's optimum, ~2-10 s a call
    print("\n| scenario | samples | trials | " + " | ".join(f"{label} F1 / ARI" for label, _, _ in fast)
          + " |\n|---|---|---|" + "---|" * len(fast))
    for scenario in ("recurring", "sparse"):
        for n, t in trials.items():
            cells = []
            for _, name, factor in fast:
                with detector(name, factor):
                    r = accuracy(n, scenario, t, seed=n)
                cells.append(f"{r['f1']:.3f} / {r['ari']:.3f}" if r["ari"] is not None else f"{r['f1']:.3f}")
            print(f"| {scenario} | {n:.0e} | {t} | " + " | ".join(cells) + " |")
    print("\n| detector | phases() on 1e6 x 8, median of 3 (s) | detector alone on 1000 x 8 block means (s) |"
          "\n|---|---|---|")
    x, _, _ = synthetic(1_000_000, "recurring", np.random.default_rng(1))
    ds = xr.Dataset({f"m{i}": ("time", x[:, i]) for i in range(D)}, coords={"time": np.arange(len(x)) * 1000})
    z = phases_module.standardize(x[: len(x) // 1000 * 1000].reshape(1000, -1, D).mean(axis=1))
    for label, name, factor in runs:
        with detector(name, factor):
            times = []
            for _ in range(1 if name and name.startswith("PELT") else 3):
                t0 = time.perf_counter()
                phases(ds, topdown=False)
                times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            phases_module.change_points(z, standardized=True)
            alone = time.perf_counter() - t0
        print(f"| {label} | {statistics.median(times):.3f} | {alone:.3f} |")


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
    parser.add_argument("--ruptures", action="store_true", help="compare with ruptures' detectors (pip install ruptures)")
    args = parser.parse_args()
    trials = {1_000: 100, 10_000: 100, 100_000: 20, 1_000_000: 5}
    if args.quick:
        trials = {n: max(2, t // 10) for n, t in trials.items()}
    if args.ruptures:
        compare_ruptures({1_000: 50, 10_000: 20, 100_000: 5} if not args.quick else {1_000: 10, 10_000: 5})
        return

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
