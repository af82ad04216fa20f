"""What lost PC samples mean, and what to do: the warnings when samples are dropped, unattributed or missing.

Shared by :class:`~gpuscope._pc_sampling.sampler.PCSampler` (at the end of a block) and
:func:`~gpuscope._pc_sampling.fast.profile_fast_topdown`.
"""

from __future__ import annotations

__all__ = ["overflow_message", "unsampled_message", "unattributed_message"]


def overflow_message(dropped: int, total: int, buffer_full: bool, period_log2: int | None) -> str:
    """What a full buffer or dropped samples mean for the result, and what to do."""
    text = f"PC sampling dropped {dropped} of {total} samples" if dropped else "PC sampling lost samples"
    if buffer_full:
        longer = 2 ** max(15, (period_log2 or 10) + 3)
        text += (": CUPTI's hardware buffer filled, and CUPTI does not count what it lost then (on the H100, a "
                 "64 MiB buffer at period 2**10 kept 2.5 M of 7.9 M samples and counted none as dropped). The "
                 "stall shares may lean toward the kernels that ran first. Sample a shorter stretch of the "
                 f"workload, a longer period (period={longer} keeps up with CUPTI's decoding), or pass a larger "
                 "hardware_buffer_size")
    else:
        text += "; use a longer period or a larger hardware_buffer_size"
    return text + "."


# CUPTI's rule for which kernels it samples (measured on the H100, CUPTI 13.0; docs/pc-sampling.md)
_FIRST_LAUNCH_RULE = (
    "CUPTI maps a kernel for PC sampling only if it did not run while CUPTI was attached outside a pc_sample block "
    "(under gs.Profiler, or between blocks)"
)


def _rule(detach: str) -> str:
    if detach in ("detached", "not attached"):
        return ("CUPTI had forgotten the process when the block started, so these kernels were not hidden by "
                "earlier profiling.")
    return (f"{_FIRST_LAUNCH_RULE}; CUPTI was not detached first ({detach or 'unknown'}). Sample in a fresh process "
            "or before profiling those kernels; unless another CUPTI tool is injected, leave GPUSCOPE_PC_DETACH "
            "unset so that the block detaches CUPTI first (docs/pc-sampling.md).")


def unsampled_message(missing: dict[str, int], unattributed: int, total: int, detach: str = "") -> str:
    """Kernels that launched in a block but have no PC sample (*missing*: kernel name -> launches): what CUPTI
    counted for them, and why."""
    names = ", ".join(f"{k} ({n} launch{'es' if n > 1 else ''})" for k, n in missing.items())
    counted = (f"CUPTI counted {unattributed} of {total} samples as unattributed (non-user kernel samples)"
               if unattributed else "CUPTI counted no sample as unattributed: their samples were lost uncounted")
    return (f"No PC samples for {names}, which ran in the block; {counted}. {_rule(detach)} (A kernel "
            "shorter than one sampling period per SM may also get no sample.)")


def unattributed_message(unattributed: int, total: int, detach: str = "") -> str:
    """Why CUPTI counted samples it gave no records for, and what to do."""
    return (f"CUPTI could not attribute {unattributed} of {total} PC samples to a kernel (its non-user kernel "
            f"samples): they have no records. {_rule(detach)}")
