"""The CUPTI clock (cupti_activity.h).

PM samples, activity records and gpuscope's user ranges are all stamped on this clock, so they line up.
"""

from __future__ import annotations

from ctypes import POINTER, byref, c_uint64

from ._api import Functions

__all__ = ["timestamp"]

_f = Functions(
    "cupti_activity.h",
    {
        # CUptiResult cuptiGetTimestamp(uint64_t* timestamp)
        "cuptiGetTimestamp": [POINTER(c_uint64)],
    },
)


def timestamp() -> int:
    """The current CUPTI timestamp in nanoseconds."""
    value = c_uint64(0)
    _f.cuptiGetTimestamp(byref(value))
    return value.value
