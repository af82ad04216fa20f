"""Can PC sampling attribute samples to a kernel that already ran under range profiling (or outside any PC block)
in the same process? Each case runs in a fresh process and prints the samples each kernel got, CUPTI's
non-user (unattributed) count and the total.

    python3 probes/probe_pc_after_ranges.py [--out rows.json]

Cases:
  range-then-pc          stream under a kernel-mode range session; PC block of stream + fma (the known loss)
  range-finalize-pc      the same with cuptiFinalize (CUPTI detached, all its state dropped) before the PC block
  outside-finalize-pc    PC block of stream; fma run outside any block; cuptiFinalize; PC block of both
  range-finalize-again   range-finalize-pc, then a range session and a PC block again (does everything still work?)
  eager-range-then-pc    range-then-pc with CUDA_MODULE_LOADING=EAGER
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CASE = r"""
import json, sys, time, ctypes
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpuscope as gs
from gpuscope.cupti import _api, activity, subscriber
from bench_fast_topdown import Pair
w = Pair()
launch = w.k.launch

def pc(names, n=10):
    with gs.pc_sample(period=1024) as s:
        for _ in range(n):
            for k in names:
                launch[k]()
    per = {}
    for f, c in zip(s.records.function, s.records.samples):
        key = "stream" if "stream" in f else "fma" if "fma" in f else f[-40:]
        per[key] = per.get(key, 0) + int(c)
    return {"per_kernel": per, "non_user": int(s.records.non_user_kernel_samples),
            "total": int(s.records.total_samples)}

def ranges(names):
    with gs.Profiler("fast-topdown", mode="kernel") as p:
        for k in names:
            launch[k]()
    return int(p.dataset.sizes["range"])

def finalize():
    t0 = time.perf_counter()
    gs.release()
    lib = _api.library().cdll
    with subscriber._lock:
        if subscriber._subscription:
            rc_u = lib.cuptiUnsubscribe(ctypes.c_void_p(subscriber._subscription[0]))
            subscriber._subscription.clear()
        else:
            rc_u = None
    lib.cuptiActivityFlushAll(1)
    rc = lib.cuptiFinalize()
    activity._registered.clear()
    return {"unsubscribe_rc": rc_u, "finalize_rc": rc, "seconds": round(time.perf_counter() - t0, 4)}

case = sys.argv[1]
out = {"case": case}
if case in ("range-then-pc", "eager-range-then-pc"):
    out["ranges"] = ranges(["stream"])
    out["pc"] = pc(["stream", "fma"])
elif case == "range-finalize-pc":
    out["ranges"] = ranges(["stream"])
    out["finalize"] = finalize()
    out["pc"] = pc(["stream", "fma"])
elif case == "outside-finalize-pc":
    out["pc1"] = pc(["stream"])
    launch["fma"]()
    out["finalize"] = finalize()
    out["pc"] = pc(["stream", "fma"])
elif case == "range-finalize-again":
    out["ranges"] = ranges(["stream"])
    out["finalize"] = finalize()
    out["pc"] = pc(["stream", "fma"])
    out["ranges2"] = ranges(["stream", "fma"])
    out["finalize2"] = finalize()
    out["pc2"] = pc(["stream", "fma"])
    out["ranges3"] = ranges(["stream", "fma"])
print("RESULT " + json.dumps(out))
"""

CASES = ["range-then-pc", "range-finalize-pc", "outside-finalize-pc", "range-finalize-again", "eager-range-then-pc"]


def run(case: str) -> dict:
    env = dict(os.environ)
    if case.startswith("eager"):
        env["CUDA_MODULE_LOADING"] = "EAGER"
    proc = subprocess.run([sys.executable, "-c", _CASE, case], capture_output=True, text=True, timeout=240,
                          cwd=ROOT, env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    row = json.loads(line[-1][7:]) if line else {"case": case, "rc": proc.returncode, "stderr": proc.stderr[-1500:]}
    row["warnings"] = [ln[:300] for ln in proc.stderr.splitlines() if "Warning" in ln][-4:]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("cases", nargs="*", default=CASES)
    args = ap.parse_args()
    rows = []
    for case in args.cases:
        row = run(case)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
