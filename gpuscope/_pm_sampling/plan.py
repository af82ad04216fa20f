"""The choices made before PM sampling starts: the interval and its trigger, the sizes of the counter-data image
pool, and the check that the metrics fit in one pass (host API only: works offline)."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence

from gpuscope._util import validate as _validate
from gpuscope.errors import NotSinglePassError

__all__ = [
    "Trigger",
    "parse_interval",
    "choose_trigger",
    "suggest_interval_us",
    "default_image_pool",
    "default_samples_per_image",
    "single_pass_groups",
    "check_single_pass",
    "MIN_INTERVAL_NS",
    "MAX_INTERVAL_NS",
    "POOL_MEMORY",
]


def suggest_interval_us(decode_us_per_sample: float) -> int:
    """The interval (µs, rounded up to a 1-2-5 step) of which decoding would take at most two thirds.

    On the H100, runs whose decoding took up to ~65% of the interval lost nothing; at ~75% a stall of the decode
    thread (a long drain) was enough to lose samples."""
    need = 1.5 * decode_us_per_sample
    for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000):
        if step >= need:
            return step
    return int(math.ceil(need))


#: Memory the default pool of counter-data images may take (bytes).
POOL_MEMORY = 1 << 30


def default_image_pool(samples_per_image: int, interval_ns: int, image_bytes: int) -> int:
    """Images in the default pool: two seconds of samples in images filled to 60% (so evaluation may fall behind
    for two seconds without losing any), at least 8, and no more than :data:`POOL_MEMORY` allows beyond those 8."""
    second = math.ceil(2e9 / (max(interval_ns, 1) * 0.6 * samples_per_image))
    return max(8, min(second, POOL_MEMORY // max(image_bytes, 1)))


def default_samples_per_image(interval_ns: int) -> int:
    """Capacity of each counter-data image: about 100 ms of samples, 256 to 8,192 (pm-default: ~21.7 KB a sample
    on GH100, pm-fast ~6.4 KB). A decode must fit in one image, and a decode under load reads up to a few tens of
    ms of samples."""
    return int(min(max(100e6 / max(interval_ns, 1), 256), 8_192))


#: Shortest interval gpuscope accepts for the time trigger (ns). Shorter intervals are rejected up front:
#: the hardware buffer fills faster than samples can be decoded (see docs/pm-sampling.md for the measurements).
MIN_INTERVAL_NS = 1_000

#: Longest interval gpuscope accepts (ns): PM sampling is for time series, and a longer one is a mistyped unit.
MAX_INTERVAL_NS = 60_000_000_000
#: Largest sys-clock interval (cycles): the hardware counts them in 32 bits.
MAX_INTERVAL_CYCLES = (1 << 32) - 1

_CYCLES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*cycles\s*$")


class Trigger(str, enum.Enum):
    """What starts a sample: a fixed time interval, or a number of sys-clock cycles (Turing and GA100)."""

    TIME = "time"
    SYSCLK = "sysclk"


def parse_interval(interval) -> tuple[int, str]:
    """Parse a sampling interval into ``(value, unit)`` with unit ``"ns"`` or ``"cycles"``.

    Accepts ``"20us"``, ``"0.5 ms"``, ``"100000ns"``, ``"1e-4s"``, ``"20000cycles"``, a
    :class:`datetime.timedelta`, or a number of nanoseconds; at most one minute (:data:`MAX_INTERVAL_NS`) or
    2**32 - 1 cycles. CUPTI takes whole ns (time trigger) or whole cycles (sys-clock trigger).

    Raises
    ------
    ValueError
        The interval is not a positive time (or cycle count) within those bounds, not a whole number of ns (or
        cycles), or its unit is unknown.
    TypeError
        The interval is neither a string, a number nor a timedelta.
    """
    match = _CYCLES_RE.match(interval) if isinstance(interval, str) else None
    if match:
        cycles = float(match.group(1))
        if not cycles.is_integer() or not 1 <= cycles <= MAX_INTERVAL_CYCLES:
            raise ValueError(f"interval must be a whole number of cycles, 1 to {MAX_INTERVAL_CYCLES:,} cycles; got "
                             f"{interval!r}.")
        return int(cycles), "cycles"
    # CUPTI takes the time trigger's interval in whole ns: a fraction would be rounded away unsaid
    return _validate.duration(interval, "interval", maximum_ns=MAX_INTERVAL_NS, whole=True), "ns"


def choose_trigger(chip: str) -> Trigger:
    """The trigger a chip supports: sys-clock cycles on Turing (TU*) and GA100, time everywhere else."""
    return Trigger.SYSCLK if chip.startswith("TU") or chip == "GA100" else Trigger.TIME


def _passes(metrics: Sequence[str], chip: str, availability) -> int:
    from gpuscope.cupti import host
    from gpuscope.cupti._types import ProfilerType

    return host.num_passes(host.config_image(chip, ProfilerType.PM_SAMPLING, metrics, availability))


def single_pass_groups(metrics: Sequence[str], chip: str, counter_availability=None):
    """Split *metrics* for PM sampling: ``(drop, groups)``.

    *drop* are metrics that need more than one pass even alone (they cannot be PM-sampled); *groups* are
    lists, in the given order, that each fit in one pass (greedy first fit).
    """
    drop, groups = [], []
    for name in metrics:
        if _passes([name], chip, counter_availability) > 1:
            drop.append(name)
            continue
        for group in groups:
            if _passes([*group, name], chip, counter_availability) == 1:
                group.append(name)
                break
        else:
            groups.append([name])
    return drop, groups


def check_single_pass(metrics: Sequence[str], chip: str, counter_availability=None) -> None:
    """Raise :class:`NotSinglePassError` unless *metrics* fit in one PM sampling pass on *chip*.

    Raises
    ------
    NotSinglePassError
        The message says which metrics to drop, and how to split the rest into one-pass lists.
    """
    passes = _passes(metrics, chip, counter_availability)
    if passes == 1:
        return
    drop, groups = single_pass_groups(metrics, chip, counter_availability)
    lines = [f"PM sampling collects one pass, but these {len(metrics)} metrics need {passes} passes on {chip}."]
    if drop:
        lines.append(
            "Drop these, which need more than one pass on their own (profile them per range with "
            f"gpuscope.Profiler instead): {drop}."
        )
    if len(groups) > 1:
        lines.append("Or split the rest into separate sampling runs, one per list:")
        lines.extend(f"  {g}" for g in groups)
    elif groups:
        lines.append(f"The rest fit in one pass: {groups[0]}.")
    raise NotSinglePassError("\n".join(lines), passes=passes, drop=drop, groups=groups)
