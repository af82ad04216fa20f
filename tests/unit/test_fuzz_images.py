"""Fuzzing the ctypes entry points that read counter-data images with truncated, bit-flipped and wrong-kind images
built from the H100 recordings. Each case runs in a subprocess: a crash or a hang fails the test (it would have
killed pytest), and every case must end in a GpuscopeError subclass or a correct answer, never a crash."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CASE = textwrap.dedent(r"""
    import json, sys
    import numpy as np
    from gpuscope.cupti import host, pm_sampling as pm, range_profiler
    from gpuscope.cupti._types import ProfilerType
    from gpuscope.errors import GpuscopeError
    fx = sys.argv[1]
    meta = json.load(open(fx + "/pm/gh100_pm_default.json"))
    PM = np.load(fx + "/pm/gh100_pm_default_counter_data.npz")["image"]
    R = np.load(fx + "/range/user_step_gh100.npz")
    RI, RM = R["counter_data"], [str(m) for m in R["metrics"]]
    rng = np.random.default_rng(0)
    def flipped(image, seed):
        out = image.copy(); r = np.random.default_rng(seed)
        pos = r.integers(0, 4096, 16); out[pos] ^= r.integers(1, 256, 16).astype(np.uint8); return out
    def pm_eval(image, index=0):
        with host.ProfilerHost("GH100", ProfilerType.PM_SAMPLING) as h:
            out = np.empty((1, 2)); h.evaluator(meta["metrics"][:2]).evaluate_into(image, index, 1, out); return out
    def range_eval(image, index=0):
        with host.ProfilerHost("GH100", ProfilerType.RANGE_PROFILER) as h:
            return h.evaluate(image, index, RM)
    cases = {
        "pm_info_truncated": lambda n: pm.counter_data_info(PM[: int(n)].copy()),
        "pm_eval_truncated": lambda n: pm_eval(PM[: int(n)].copy()),
        "pm_eval_index": lambda i: pm_eval(PM, int(i)),
        "pm_flipped": lambda seed: (pm.counter_data_info(flipped(PM, int(seed))), pm_eval(flipped(PM, int(seed)))),
        "range_name_of_pm_image": lambda i: host.range_name(PM, int(i)),
        "range_eval_truncated": lambda n: range_eval(RI[: int(n)].copy()),
        "range_eval_index": lambda i: range_eval(RI, int(i)),
        "range_image_as_pm": lambda i: pm_eval(RI, int(i)),
        "not_an_image": lambda n: pm.counter_data_info(np.zeros(int(n), np.uint8)),
    }
    try:
        result = cases[sys.argv[2]](sys.argv[3])
        print(json.dumps({"ok": repr(result)[:200]}))
    except GpuscopeError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)[:300]}))
""")

PM_SIZE = 8665436
CASES = [
    ("pm_info_truncated", 8), ("pm_info_truncated", 4096), ("pm_info_truncated", 100_000),
    ("pm_info_truncated", PM_SIZE // 2),
    ("pm_eval_truncated", 64), ("pm_eval_truncated", 100_000),
    ("pm_eval_index", 261), ("pm_eval_index", 400), ("pm_eval_index", 100_000), ("pm_eval_index", -1),
    ("pm_flipped", 3),
    ("range_name_of_pm_image", 0),
    ("range_eval_truncated", 4096), ("range_eval_index", 1000),
    ("range_image_as_pm", 0),
    ("not_an_image", 16), ("not_an_image", 4096),
]


def run_case(case, arg):
    out = subprocess.run([sys.executable, "-c", CASE, str(ROOT / "tests" / "fixtures"), case, str(arg)],
                         capture_output=True, text=True, timeout=240, cwd=ROOT)
    if out.returncode != 0:
        return f"{case}({arg}) crashed or failed: status {out.returncode}: {out.stderr[-500:]}"
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    return None if answer.get("error") == "CounterDataImageError" else f"{case}({arg}) gave {answer}"


def test_bad_images_raise_gpuscope_errors_never_crash():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(CASES), os.cpu_count() or 2)) as pool:
        failures = [f for f in pool.map(lambda c: run_case(*c), CASES) if f]
    assert failures == []
