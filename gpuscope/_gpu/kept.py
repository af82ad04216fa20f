"""A profiler kept between sessions (:class:`Kept`) and how one is let go of: released, abandoned or forgotten.

What a session hands the keeper (:mod:`gpuscope._gpu.keep`) when it ends cleanly: an enabled, stopped range profiler
or PM sampler with its configuration, images and context. Letting go of one tries every step (disable, then
``cuptiProfilerDeInitialize``, then the context) whatever fails before: a half-released profiler would block every
later detach. One whose context is gone, whose disable failed, or that CUPTI forgot (another client's
``cuptiFinalize``) is never disabled again (:func:`abandon`). Which one to let go of, and when, is the keeper's.
"""

from __future__ import annotations

import dataclasses
import warnings

from gpuscope.errors import GpuscopeWarning

__all__ = ["Kept", "abandon", "forget", "let_go"]


@dataclasses.dataclass
class Kept:
    """An enabled, stopped range profiler (or PM sampler) with its configuration and re-initialised images."""

    key: tuple  # everything the configuration depends on (context, metrics, modes, sizes)
    context_id: int  # the context's unique id: a context destroyed and made again at the same address differs
    context: object  # the retained PrimaryContext (released with the profiler)
    profiler: object  # gpuscope.cupti.range_profiler.RangeProfiler, or a PM sampling object (its close() does all)
    config: object
    image: object  # the range profiler's counter-data image, or the PM sampler's ImagePool (with its workers)
    timer: object = None  # releases it when idle too long
    witness: int = 0  # profiler.lend_witness() when kept: 0 (nothing vouches), None (another client subscribed)

    @property
    def kind(self) -> str:
        """What is kept, in words: ``"PM sampler"`` or ``"range profiler"``."""
        return "PM sampler" if self.key[:1] == ("pm",) else "range profiler"


def let_go(kept: Kept, alive: bool = True, quiet: bool = False) -> None:
    """Disable *kept*'s profiler, then de-initialise and let go of the context, each step tried whatever failed
    before it (a profiler that cannot be disabled is never touched again)."""
    from gpuscope.cupti import callbacks, profiler

    if kept.timer is not None:
        kept.timer.cancel()
    if not callbacks.held(kept.witness):  # another client finalized CUPTI: its profiler is gone with it
        forget(kept)
        return
    errors = []
    if alive:
        try:
            kept.context.make_current()  # the release may run on the timer's thread
            kept.profiler.close()
        except Exception as exc:
            errors.append(exc)
            abandon(kept.profiler)
    else:  # its context is gone, and CUPTI's state with it: do not touch the profiler
        abandon(kept.profiler)
    for step in (lambda: profiler.deinitialize(kept=True), kept.context.close):
        try:
            step()
        except Exception as exc:
            errors.append(exc)
    if errors and not quiet:  # cleanup never raises
        warnings.warn(f"gpuscope: releasing the kept {kept.kind} failed: {'; '.join(map(str, errors))}",
                      GpuscopeWarning, stacklevel=3)


def abandon(profiler) -> None:
    """Make sure nothing ever disables *profiler* (a range profiler disables itself when collected; a PM sampling
    object keeps its images for good and stops its evaluation workers: its ``detach()``): its context is gone, its
    disable failed, or CUPTI forgot it."""
    finalizer = getattr(profiler, "_finalizer", None)
    if finalizer is not None:
        finalizer.detach()
    detach = getattr(profiler, "detach", None)
    if detach is not None:
        detach()


def forget(kept: Kept) -> None:
    """Let go of *kept* after CUPTI forgot it: its profiler and the CUPTI profiler initialisation it held are
    never touched again (they are gone); its context, the driver's, is let go of."""
    if kept.timer is not None:
        kept.timer.cancel()
    abandon(kept.profiler)
    try:
        kept.context.close()
    except Exception as exc:  # cleanup never raises
        warnings.warn(f"gpuscope: letting go of the kept profiler's context failed: {exc}", GpuscopeWarning,
                      stacklevel=3)
