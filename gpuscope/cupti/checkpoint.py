"""The CUPTI Checkpoint API (cupti_checkpoint.h, in libcheckpoint.so beside libcupti): 1:1, no policy.

A checkpoint saves a context's device memory (and, if asked, host-pinned memory) so that a re-run of a
workload can start from the same state: save once, restore before every later pass, free at the end.
"""

from __future__ import annotations

import warnings
import weakref
from ctypes import POINTER

from gpuscope.cupti import _types as T
from gpuscope.cupti._api import Functions, params
from gpuscope.cupti._types import CheckpointOptimizations
from gpuscope.errors import GpuscopeWarning

__all__ = ["Checkpoint"]

_f = Functions(
    "cupti_checkpoint.h",
    {
        # CUptiResult cuptiCheckpointSave(CUpti_Checkpoint* handle)
        "cuptiCheckpointSave": [POINTER(T.CUpti_Checkpoint)],
        # CUptiResult cuptiCheckpointRestore(CUpti_Checkpoint* handle)
        "cuptiCheckpointRestore": [POINTER(T.CUpti_Checkpoint)],
        # CUptiResult cuptiCheckpointFree(CUpti_Checkpoint* handle)
        "cuptiCheckpointFree": [POINTER(T.CUpti_Checkpoint)],
    },
    library="checkpoint",
)


def _free(handle) -> None:
    try:
        _f.cuptiCheckpointFree(handle)
    except Exception as exc:  # cleanup must not raise
        warnings.warn(f"cuptiCheckpointFree failed: {exc}", GpuscopeWarning, stacklevel=2)


class Checkpoint:
    """A saved copy of a context's device memory (``cuptiCheckpointSave``; :meth:`close` frees it).

    Parameters
    ----------
    ctx : int
        The ``CUcontext`` handle whose memory to save.
    reserve_device_mb, reserve_host_mb : int
        Memory CUPTI should reserve up front for the copy (0: decide itself).
    allow_overwrite : bool
        Whether a later :meth:`save` may overwrite this checkpoint.
    optimizations : CheckpointOptimizations
        ``TRANSFER`` lets CUPTI skip buffers that did not change.

    Raises
    ------
    CuptiError
        The save failed (for example ``CuptiMemoryError`` when there is no room for the copy).
    """

    def __init__(self, ctx: int, reserve_device_mb: int = 0, reserve_host_mb: int = 0, allow_overwrite: bool = True,
                 optimizations: CheckpointOptimizations = CheckpointOptimizations.NONE):
        self._c = params(
            T.CUpti_Checkpoint,
            ctx=ctx,
            reserveDeviceMB=reserve_device_mb,
            reserveHostMB=reserve_host_mb,
            allowOverwrite=int(allow_overwrite),
            optimizations=int(optimizations),
        )
        _f.cuptiCheckpointSave(self._c)
        self._finalizer = weakref.finalize(self, _free, self._c)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def save(self) -> None:
        """Save again, overwriting this checkpoint (needs ``allow_overwrite``)."""
        self._check()
        _f.cuptiCheckpointSave(self._c)

    def restore(self) -> None:
        """Put the saved memory back (``cuptiCheckpointRestore``)."""
        self._check()
        _f.cuptiCheckpointRestore(self._c)

    def close(self) -> None:
        """``cuptiCheckpointFree`` (safe to call twice)."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check(self) -> None:
        if self.closed:
            raise ValueError("This Checkpoint was freed; save a new one.")
