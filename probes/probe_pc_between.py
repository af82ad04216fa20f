"""Range profiling, PC sampling, range profiling, PC sampling in one process (the ``between`` order of
``tests/gpu/test_pc_sampling.py``): which cubin CRCs the second block's records carry, against the CRCs of the
cubins gpuscope knows (each block's fresh dispatchers), and which source lines each block resolves.

    python3 probes/probe_pc_between.py [--out between.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # benchmarks/: workloads, the benchmarks reused


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--steps", action="store_true", help="which step breaks the source lookup (see steps())")
    args = ap.parse_args()
    if args.steps:
        rows = steps()
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
        return

    import gpuscope as gs
    from benchmarks import bench_pc_sampling as B
    from gpuscope._pc_sampling.source import CubinRegistry
    from gpuscope.cupti.pc_sampling import sass_to_source

    work = B.Workload()
    blocks = []
    known: dict[int, str] = {}

    def ranges():
        with gs.Profiler("topdown", mode="kernel") as prof:
            work.run(2)
        return prof.dataset.sizes["range"]

    def pcs(label):
        fresh = B.Workload(fresh=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with gs.pc_sample(period=2**10, kernels=list(fresh.kernels)) as s:
                fresh.run(20)
        registry = CubinRegistry()
        mine = {}
        for k in fresh.kernels:
            for crc in registry.add(k):
                mine[crc] = f"{label}:{k.py_func.__name__}"
        known.update(mine)
        rec = s.records
        seen = sorted({(int(c), str(f)[-60:]) for c, f in zip(rec.cubin_crc, rec.function)})
        probes = []
        for c, f in sorted({(int(c), str(f)) for c, f in zip(rec.cubin_crc, rec.function)}):
            cubin = registry.get(c, f)
            offsets = sorted({int(o) for cc, ff, o in zip(rec.cubin_crc, rec.function, rec.pc_offset)
                              if int(cc) == c and str(ff) == f})
            try:
                loc = sass_to_source(cubin, f, offsets[0]) if cubin is not None else "no cubin"
            except Exception as exc:  # what CUPTI says
                loc = f"{type(exc).__name__}: {exc}"
            names = [n for n in (b"stream", b"fma") if cubin is not None and n in cubin]
            probes.append({"crc": c, "function": f[-70:], "first_offset": offsets[0], "max_offset": offsets[-1],
                           "cubin_bytes": None if cubin is None else len(cubin), "names_in_cubin": str(names),
                           "function_in_cubin": cubin is not None and f.encode() in cubin, "lookup": str(loc)})
        ds = s.dataset
        lines = sorted({(str(f)[-30:], int(ln)) for f, ln in zip(ds["function"].values, ds["line"].values)
                        if int(ln) > 0})[:12] if "line" in ds else []
        blocks.append({
            "block": label,
            "record_crcs": [(c, f, known.get(c, "unknown")) for c, f in seen],
            "lookups": probes,
            "fresh_crcs": mine,
            "non_user_kernel_samples": int(ds.attrs.get("non_user_kernel_samples", 0)),
            "samples": int(ds.attrs.get("total_samples", 0)),
            "functions_without_lineinfo": ds.attrs.get("functions_without_lineinfo", ""),
            "lines": lines,
            "warnings": [str(w.message)[:200] for w in caught],
        })
        print(json.dumps(blocks[-1], default=str), flush=True)

    print("ranges", ranges(), flush=True)
    pcs("first")
    print("ranges", ranges(), flush=True)
    pcs("second")
    pcs("third")
    if args.out:
        Path(args.out).write_text(json.dumps(blocks, indent=1, default=str))


STEPS = """
import gc, json, sys, warnings
warnings.simplefilter("ignore")
import gpuscope as gs
from benchmarks import bench_pc_sampling as B
from gpuscope._pc_sampling.source import CubinRegistry, numba_cubins
from gpuscope.cupti.pc_sampling import sass_to_source

work = B.Workload()
fresh = B.Workload(fresh=True)
with gs.pc_sample(period=2**12, kernels=list(fresh.kernels)) as s:
    fresh.run(4)
fn = [f for f in set(map(str, s.records.function)) if "stream" in f][0]
keep = bytes(numba_cubins(fresh.kernels[0])[0])
out = []

def look(step):
    row = {"step": step}
    for label, buf in (("kept", keep), ("copy", bytes(bytearray(keep)))):
        try:
            row[label] = sass_to_source(buf, fn, 16).line
        except Exception as exc:
            row[label] = type(exc).__name__ + ": " + str(exc)[-40:]
    out.append(row)

look("after block 1")
for step in sys.argv[1].split(","):
    if step == "free":
        del fresh
        gc.collect()
    elif step == "empty_block":
        with gs.pc_sample(period=2**12):
            pass
    elif step == "block_same":
        with gs.pc_sample(period=2**12):
            work.run(2)
    elif step == "ranges":
        with gs.Profiler("launch", mode="kernel"):
            work.run(2)
    elif step == "ranges_iteration":
        with gs.Profiler("launch", mode="iteration") as p:
            p.step(); work.run(2); p.step(); work.run(2)
    elif step == "fresh_block":
        f2 = B.Workload(fresh=True)
        with gs.pc_sample(period=2**12, kernels=list(f2.kernels)) as s2:
            f2.run(4)
        look("fresh_block own: " + str(s2.dataset.attrs["functions_without_lineinfo"] or "lines ok"))
        import re
        from gpuscope.cupti.pc_sampling import cubin_crc
        cub2 = bytes(numba_cubins(f2.kernels[0])[0])
        fn2 = [f for f in set(map(str, s2.records.function)) if "stream" in f][0]
        off2 = int(min(o for o, f in zip(s2.records.pc_offset, s2.records.function) if str(f) == fn2))
        detail = {"record_fn_block1": fn, "record_fn_block2": fn2, "names_in_cubin2": sorted(
            {m.decode() for m in re.findall(rb"_Z[0-9A-Za-z_]+", cub2) if b"stream" in m}),
            "cubin2_equals_cubin1": cub2 == keep, "crc1": int(cubin_crc(keep)), "crc2": int(cubin_crc(cub2)),
            "record_crcs_block2": sorted({int(c) for c in s2.records.cubin_crc}), "offset": off2}
        for label, buf, name in (("cubin2,fn2", cub2, fn2), ("cubin1,fn2", keep, fn2), ("cubin2,fn1", cub2, fn),
                                 ("cubin1,fn1", keep, fn)):
            try:
                detail[label] = sass_to_source(buf, name, off2).line
            except Exception as exc:
                detail[label] = type(exc).__name__ + ": " + str(exc)[-40:]
        out.append(detail)
    elif step == "sample":
        with gs.sample("pm-default", interval="100us"):
            work.run(2)
    look("after " + step)
print("RESULT " + json.dumps(out))
"""


def steps(orders=("fresh_block",)):
    """Which step makes ``cuptiGetSassToSourceCorrelation`` fail for a cubin it resolved before: each order in
    a fresh process, a lookup of block 1's cubin (the kept bytes and a new copy) after every step."""
    import subprocess

    rows = []
    for order in orders:
        proc = subprocess.run([sys.executable, "-c", STEPS, order], capture_output=True, text=True, timeout=240,
                              cwd=Path(__file__).resolve().parents[1])
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        row = {"order": order, "lookups": json.loads(line[-1][7:]) if line else proc.stderr[-1500:]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
