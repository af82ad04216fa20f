"""Three gs.sample(kernels=True) sessions in one process, each followed by a kernel-mode Top-Down and
gs.dynamic: the GPU test process ran two (a shuffled order re-created the fixture) and crashed. On the H100
(CUPTI 13.0) the kernel-mode session after the first kernels=True session hung (killed after 120 s); gpuscope
now refuses kernel replay after kernels=True with SessionConflictError, which this probe shows.

    python3 -X faulthandler benchmarks/probe_kernel_records_twice.py
"""

from numba import cuda

import gpuscope as gs
from gpuscope import _demo

work = _demo.build_workload(n=1 << 22, fma_iters=500)
for name in _demo.PHASES:
    work.launch(name)
cuda.synchronize()
for r in range(3):
    with gs.sample("pm-default", interval="100us", kernels=True) as s:
        for name in _demo.PHASES:
            with gs.range(name):
                for _ in range(200):
                    work.launch(name)
                cuda.synchronize()
    table = gs.kernel_executions(s.dataset)
    print(r, "executions", len(table), "dropped", s.dataset.attrs["kernel_records_dropped"], flush=True)
    with gs.Profiler("topdown", mode="kernel") as p:
        for name in _demo.PHASES:
            work.launch(name)
        cuda.synchronize()
    ph = gs.phases(s.dataset)
    print(r, "phases", int(ph.sizes.get("phase_id", 0)), flush=True)
    per = gs.dynamic(gs.topdown(p.dataset, check="ignore"), phases=ph)
    print(r, "dynamic", per.attrs.get("topdown_by"), [round(float(v), 2) for v in per["attributed_fraction"].values],
          flush=True)
