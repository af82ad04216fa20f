"""Fuzzing the ctypes entry points that read CUPTI images with truncated, zeroed, random, bit-flipped and wrong-kind
images built from the H100 recordings: counter-data images, counter-availability images and config images. Each
case runs in a subprocess: a crash or a hang fails the test (it would have killed pytest), and every case must end
in a GpuscopeError subclass or an answer, never a crash."""

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
    def pm_series(image):  # offline evaluation of a saved image, every sample
        from gpuscope._pm_sampling.series import evaluate_images
        stamps = np.load(fx + "/pm/gh100_pm_default_timestamps.npy")
        return evaluate_images("GH100", meta["metrics"], [image], [stamps]).values.shape
    def first_then(look, use, image):  # a look that reads only the counts first, on the same array, then a use
        from gpuscope.cupti import _images
        _images.CHECK_TIMEOUT_S = 20.0  # a hang costs 20 s, not 60; a sound image takes about a second
        look(image)
        return use(image)
    def reused(use, sound, damaged):  # one buffer: the sound image used, the damaged one copied in, used again
        buffer = sound.copy()
        use(buffer)
        np.copyto(buffer, damaged)
        return use(buffer)
    import gpuscope as gs
    AV = {k: np.load(f"{fx}/gh100_counter_availability_{k}.npy") for k in ("range", "pm")}
    CFG = np.load(fx + "/pm/gh100_pm_default_config.npy")
    OTHER = ["smsp__inst_executed.sum", "dram__bytes_read.sum", "l1tex__t_bytes.sum", "lts__t_bytes.sum"]
    def bytes_flipped(image, seed, n):
        out = image.copy(); r = np.random.default_rng(seed)
        out[r.integers(0, out.size, n)] ^= r.integers(1, 256, n).astype(np.uint8); return out
    def availability(spec):  # "<range|pm>:<how>:<n>"
        kind, how, n = spec.split(":")
        image, n = AV[kind], int(n)
        return kind, {"flip": lambda: bytes_flipped(image, n, 16), "bit": lambda: bytes_flipped(image, n, 1),
                      "cut": lambda: image[:n].copy(), "zero": lambda: np.zeros_like(image),
                      "random": lambda: rng.integers(0, 256, image.size).astype(np.uint8),
                      "bytes": lambda: bytes(range(n)) if n > 1 else bytes(n)}[how]()
    def use_availability(spec, chip="GH100"):  # every way in, with other metrics than the check's own
        kind, image = availability(spec)
        ptype = ProfilerType.RANGE_PROFILER if kind == "range" else ProfilerType.PM_SAMPLING
        return (host.max_metrics_per_pass(chip, ptype, image),
                host.num_passes(host.config_image(chip, ptype, OTHER[:2], image)),
                gs.count_passes(OTHER, chip, "range" if kind == "range" else "sampling", counter_availability=image))
    def config(spec):
        how, n = spec.split(":")
        n = int(n)
        return {"flip": lambda: bytes_flipped(CFG, n, 16), "bit": lambda: bytes_flipped(CFG, n, 1),
                "cut": lambda: CFG[:n].copy(), "zero": lambda: np.zeros_like(CFG),
                "random": lambda: rng.integers(0, 256, CFG.size).astype(np.uint8)}[how]()
    cases = {
        "availability": use_availability,
        "availability_of_gh100_for_ga100": lambda spec: use_availability(spec, "GA100"),
        "config_passes": lambda spec: host.num_passes(config(spec)),
        "pm_info_truncated": lambda n: pm.counter_data_info(PM[: int(n)].copy()),
        "pm_eval_truncated": lambda n: pm_eval(PM[: int(n)].copy()),
        "pm_eval_index": lambda i: pm_eval(PM, int(i)),
        "pm_flipped": lambda seed: (pm.counter_data_info(flipped(PM, int(seed))), pm_eval(flipped(PM, int(seed)))),
        "pm_info_then_series": lambda seed: first_then(pm.counter_data_info, pm_series, flipped(PM, int(seed))),
        "pm_series_reused": lambda seed: reused(pm_series, PM, flipped(PM, int(seed))),
        "range_count_then_eval": lambda seed: first_then(range_profiler.num_ranges, range_eval, flipped(RI, int(seed))),
        "range_name_then_eval": lambda seed: first_then(
            lambda image: host.range_name(image, 0), range_eval, flipped(RI, int(seed))),
        "range_eval_reused": lambda seed: reused(range_eval, RI, flipped(RI, int(seed))),
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
    # Flips whose counts CUPTI reads without harm but whose evaluation crashes it (PM 20, range 2) or spins for ever
    # (PM 37): first the counts (or a range name), then an evaluation of the same array; and a sound
    # image evaluated, then a damaged one copied into the same buffer. Each used to kill the process or hang it.
    ("pm_info_then_series", 20), ("pm_info_then_series", 37),
    ("pm_series_reused", 20),
    ("range_count_then_eval", 2), ("range_name_then_eval", 2), ("range_eval_reused", 2),
    ("not_an_image", 16), ("not_an_image", 4096),
]


#: Counter-availability and config images: (case, spec, what may come of it). "ImageError": refused by the check;
#: "any": refused by the check, refused by CUPTI (a CuptiError) or evaluated, but never a crash. The flips
#: marked ImageError crash CUPTI (SIGSEGV) without the check, as do the empty, short and random images.
REFUSED, ANY = {"ImageError"}, {"ImageError", "CuptiError", "ok"}
FLAT_CASES = [
    ("availability", "range:bytes:0", REFUSED), ("availability", "range:bytes:1", REFUSED),
    ("availability", "range:bytes:64", REFUSED), ("availability", "range:random:0", REFUSED),
    ("availability", "range:zero:0", REFUSED), ("availability", "pm:cut:100", REFUSED),
    ("availability", "range:cut:412", ANY), ("availability", "pm:cut:4000", ANY),
    ("availability", "range:flip:34", REFUSED), ("availability", "range:flip:52", REFUSED),
    ("availability", "pm:flip:7", REFUSED), ("availability", "pm:flip:53", REFUSED),
    ("availability", "pm:flip:27", ANY), ("availability", "range:flip:0", ANY),
    ("availability", "range:bit:1", ANY), ("availability", "pm:bit:2", ANY),
    ("availability_of_gh100_for_ga100", "range:flip:0", REFUSED),
    ("config_passes", "cut:0", REFUSED), ("config_passes", "cut:100", REFUSED), ("config_passes", "cut:2000", REFUSED),
    ("config_passes", "zero:0", REFUSED), ("config_passes", "random:0", REFUSED),
    ("config_passes", "flip:49", REFUSED), ("config_passes", "flip:58", REFUSED),
    ("config_passes", "flip:0", ANY), ("config_passes", "bit:1", ANY),
]


def run_case(case, arg, allowed=frozenset({"CounterDataImageError"})):
    out = subprocess.run([sys.executable, "-c", CASE, str(ROOT / "tests" / "fixtures"), case, str(arg)],
                         capture_output=True, text=True, timeout=240, cwd=ROOT)
    if out.returncode != 0:
        return f"{case}({arg}) crashed or failed: status {out.returncode}: {out.stderr[-500:]}"
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    return None if answer.get("error", "ok") in allowed else f"{case}({arg}) gave {answer}"


def run_all(cases):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(cases), os.cpu_count() or 2)) as pool:
        return [f for f in pool.map(lambda c: run_case(*c), cases) if f]


def test_bad_images_raise_gpuscope_errors_never_crash():
    assert run_all(CASES) == []


def test_bad_availability_and_config_images_are_refused_never_crash():
    assert run_all(FLAT_CASES) == []
