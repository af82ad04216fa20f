"""PM sampling with evaluation workers under the faults of issue 24, on the GPU: a silent connection from another
user on the workers' socket, a child forked during sampling that leaves through sys.exit, a SIGSTOPped worker, and
a parent killed with SIGKILL (its workers must print nothing). Prints one JSON line per case.

    python3 benchmarks/check_pm_faults.py
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _addresses() -> set[str]:
    text = Path("/proc/net/unix").read_text()
    return {w[1:] for line in text.splitlines() for w in line.split() if w.startswith("@gpuscope-pm-")}


def _stranger(address: str, hold_s: float) -> None:
    """Connect as another user (nobody) and send nothing."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(pwd.getpwnam("nobody").pw_gid)
            os.setuid(pwd.getpwnam("nobody").pw_uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect("\0" + address)
            time.sleep(hold_s)
        finally:
            os._exit(0)
    threading.Thread(target=os.waitpid, args=(pid, 0), daemon=True).start()


def workload(seconds: float):
    from numba import cuda

    from gpuscope._commands import demo as _demo

    work = _demo.build_workload(n=1 << 22, fma_iters=500)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        work.launch("stream")
        work.launch("fma")
    cuda.synchronize()
    return work


def case_stranger(connect: bool = True):
    import gpuscope as gs

    workload(0.1)
    before = _addresses()
    t0 = time.perf_counter()
    with gs.sample("pm-default", interval="100us", evaluate_in="process") as s:
        time.sleep(0.2)
        new = _addresses() - before
        uid0 = os.getuid() == 0
        for a in new:
            if uid0 and connect:
                _stranger(a, 30)
        workload(1.5)
    ds = s.dataset
    return {"case": "stranger" if connect else "no stranger (baseline)", "as_root": uid0, "sockets": len(new), "wall_s": round(time.perf_counter() - t0, 2),
            "samples": int(ds.sizes["time"]), "lost": int(ds.attrs["lost_samples"]),
            "images_lost": int(ds.attrs["images_lost"]), "workers_lost": int(ds.attrs["evaluation_workers_lost"]),
            "errors": str(ds.attrs.get("decode_errors", ""))[:200]}


def case_baseline():
    return case_stranger(connect=False)


def case_fork():
    import gpuscope as gs

    workload(0.1)
    t0 = time.perf_counter()
    with gs.sample("pm-default", interval="100us", evaluate_in="process") as s:
        workload(0.5)
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # leaves the with block in the child
        t = time.perf_counter()
        _, status = os.waitpid(pid, 0)
        child_s = time.perf_counter() - t
        workload(0.5)
    ds = s.dataset
    return {"case": "fork", "child_exit_s": round(child_s, 3), "child_status": status,
            "wall_s": round(time.perf_counter() - t0, 2), "samples": int(ds.sizes["time"]),
            "lost": int(ds.attrs["lost_samples"]), "workers_lost": int(ds.attrs["evaluation_workers_lost"])}


def case_sigstop_plain():
    import gpuscope as gs

    workload(0.1)
    t0 = time.perf_counter()
    me = os.getpid()
    with gs.sample("pm-default", interval="100us", evaluate_in="process", evaluators=1) as s:
        time.sleep(0.3)
        kids = [int(p) for p in subprocess.run(["pgrep", "-P", str(me)], capture_output=True, text=True).stdout.split()]
        for k in kids:
            os.kill(k, signal.SIGSTOP)
        workload(2.0)
    ds = s.dataset
    return {"case": "sigstop", "stopped": len(kids), "wall_s": round(time.perf_counter() - t0, 2),
            "samples": int(ds.sizes["time"]), "lost": int(ds.attrs["lost_samples"]),
            "images_lost": int(ds.attrs["images_lost"]), "workers_lost": int(ds.attrs["evaluation_workers_lost"])}


_KILLED = r"""
import os, signal, sys, time
sys.path.insert(0, "benchmarks")
import gpuscope as gs
from check_pm_faults import workload
workload(0.1)
with gs.sample("pm-default", interval="100us", evaluate_in="process"):
    workload(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def case_killed():
    p = subprocess.run([sys.executable, "-c", _KILLED], capture_output=True, text=True, cwd=ROOT, timeout=120)
    time.sleep(2)  # the workers notice the closed socket
    stray = subprocess.run(["pgrep", "-f", "gpuscope._pm_sampling.workers"], capture_output=True, text=True).stdout.split()
    return {"case": "killed", "rc": p.returncode, "stderr": p.stderr.strip()[-400:], "workers_left": len(stray)}


def main():
    for name in sys.argv[1:] or ["baseline", "stranger", "baseline", "stranger", "fork",
                                            "sigstop_plain", "killed"]:
        if name == "killed":
            print(json.dumps(case_killed()), flush=True)
            continue
        out = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, cwd=ROOT,
                             timeout=200)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        print(line[-1] if line else json.dumps({"case": name, "rc": out.returncode, "stderr": out.stderr[-600:]}),
              flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(globals()[f"case_{sys.argv[2]}"]()))
    else:
        main()
