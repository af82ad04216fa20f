"""Merge time of per-rank PM sampling files (gs.open_ranks) for 8, 64, 256 ranks, and file size per rank per minute.

    python3 benchmarks/bench_merge_ranks.py [--ranks 8 64 256] [--seconds 10]

Rank files are the H100 recording gpuscope/data/demo_timeseries.nc (8 pm-default metrics at 100 µs) repeated to
*seconds* of samples, values perturbed per rank (so compression sees realistic data), written with
gs.save_dataset to a temporary folder. Prints bytes per sample per metric of the shipped recording, the size per
rank per minute, and per rank count: write time, open_ranks time (reading + merging) and merged size in memory.
"""

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import gpuscope as gs
from gpuscope._schema.dataset import TABLE_ATTRS

DATA = Path(gs.__file__).parent / "data" / "demo_timeseries.nc"


def rank_file(base, seconds: float, rank: int, rng):
    n0 = base.sizes["time"]
    interval = int(base.attrs["interval_ns"])
    n = int(seconds * 1e9 / interval)
    idx = np.arange(n) % n0
    ds = base.isel(time=idx)
    shift = np.arange(n, dtype=np.int64) * interval
    ds = ds.assign_coords(time=("time", shift + interval, ds["time"].attrs),
                          start_ns=("time", shift + int(base.attrs["session_start_ns"]), ds["start_ns"].attrs),
                          end_ns=("time", shift + interval + int(base.attrs["session_start_ns"]), ds["end_ns"].attrs))
    for name in ds.data_vars:
        ds[name] = ds[name] * (1 + 0.01 * rng.standard_normal(n))
    ds.attrs.update(rank=rank, world_size=0, host=f"node{rank // 8}", local_rank=rank % 8,
                    wall_clock_ns=int(base.attrs["session_start_ns"]) + rank * 1000)
    # the repeated samples no longer lie in the recording's user ranges: no span table, no span per sample
    ds.attrs = {k: v for k, v in ds.attrs.items() if k not in TABLE_ATTRS}
    return ds.drop_vars("span_index", errors="ignore")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of samples per rank file")
    args = parser.parse_args(argv)
    base = gs.open_dataset(DATA)
    n, m = base.sizes["time"], len(base.data_vars)
    size = DATA.stat().st_size
    per_minute = size / n * (60e9 / int(base.attrs["interval_ns"]))
    print(f"recording: {n} samples x {m} metrics at {int(base.attrs['interval_ns']) / 1e3:.0f} us, {size} bytes: "
          f"{size / n / m:.2f} bytes per sample per metric, {per_minute / 1e6:.1f} MB per rank per minute")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        one = rank_file(base, args.seconds, 0, rng)
        gs.save_dataset(one, Path(tmp) / "probe.nc")
        s = (Path(tmp) / "probe.nc").stat().st_size
        print(f"synthetic rank file: {one.sizes['time']} samples ({args.seconds:g} s), {s} bytes, "
              f"{s / one.sizes['time'] / m:.2f} bytes per sample per metric")
        for ranks in args.ranks:
            folder = Path(tmp) / f"r{ranks}"
            folder.mkdir()
            t0 = time.perf_counter()
            for r in range(ranks):
                ds = rank_file(base, args.seconds, r, rng)
                ds.attrs["world_size"] = ranks
                gs.save_dataset(ds, folder / f"prof-{r}.nc")
            write = time.perf_counter() - t0
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", gs.GpuscopeWarning)
                merged = gs.open_ranks(str(folder / "prof-{rank}.nc"))
            merge = time.perf_counter() - t0
            print(f"ranks {ranks:4d}: write {write:7.2f} s, open_ranks {merge:7.2f} s "
                  f"({merge / ranks * 1e3:.1f} ms per rank), merged {merged.nbytes / 1e6:8.1f} MB in memory")
            del merged


if __name__ == "__main__":
    main()
