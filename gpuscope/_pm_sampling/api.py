"""``gpuscope.sample``: the entry point of PM sampling, one device (:class:`Sampler`) or several (:class:`MultiSampler`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuscope._pm_sampling.multi import MultiSampler
from gpuscope._pm_sampling.sampler import Sampler

__all__ = ["sample"]


def sample(metrics="pm-default", interval="100us", device: int | str | Sequence[int] = 0, **options):
    """Sample hardware metrics over time on a GPU, or on several (CUPTI PM sampling): no replay, low overhead.

    Parameters
    ----------
    metrics : str or list of str
        A sampling metric-set name (``"pm-default"``, ``"pm-fast"``) or full metric names. They must fit in one
        pass.
    interval : str, timedelta or int
        Time between samples: ``"20us"``, ``"100 us"``, ``"1ms"`` or ns. On Turing and GA100, which sample
        on sys-clock cycles, a time is converted (estimate) and ``"<n>cycles"`` is taken as is.

        Decoding each sample costs CPU time that grows with the metrics' counter instances (per-SM counters
        are the dearest), and CUPTI decodes on one thread: on the H100, ``pm-default`` costs about 40 µs per
        sample and samples every 100 µs without loss; ``pm-fast`` costs about 7-13 µs and samples every 20 µs
        without loss. A shorter interval loses samples, counted in ``attrs["lost_samples"]`` with a warning
        that gives the decode cost measured in the run and the interval to use. At most one minute (or
        2**32 - 1 cycles).
    device : int, "all" or list of int
        CUDA device index (0 to 1023). ``"all"`` (every device this process sees) or a list of distinct indices
        such as ``[0, 1]`` samples those devices at once, one independent session per device, all started on
        entry and all stopped on exit (also when one of them fails), into one Dataset with a ``device`` dim (see
        :func:`gpuscope.combine_devices`; ``kernels=True`` is for one device).
    hardware_buffer_size : int, optional
        Bytes of device memory CUPTI uses as the hardware sample buffer (default 512 MiB; 1 MiB to 1 TiB).
    decode_period : float, optional
        Seconds between decodes by the background thread (default 0.01; 0.001 to 60: each decode reads every
        sample waiting, so a shorter period would only spin the thread).
    samples_per_image : int, optional
        Capacity of each counter-data image (default: 100 ms of samples, 256 to 8,192; 2 to 2**20). An image is handed to the
        evaluators before a decode could fill it: a decode that fills its image loses the samples beyond it.
    image_pool : int, optional
        Counter-data images made up front and recycled (default: two seconds of samples, at least 8, within
        1 GiB; 1 to 65,536). If evaluation falls behind and none is free,
        samples are discarded and counted (``attrs["discarded_samples"]``, part of ``lost_samples``).
    evaluators : int, optional
        Worker processes (or threads, with ``evaluate_in="thread"``) that evaluate samples while sampling runs
        (default 2; 1 to 256).
    evaluate_in : {"process", "thread"}, optional
        Where samples are evaluated (default ``"process"``): worker processes with their own host object, which
        never compete with your Python threads for the GIL (timestamps rebuilt from each sample's duration and
        anchors read on the device; ``attrs["inexact_batches"]`` counts batches read exactly instead), or threads
        of this process (timestamps from ``GetSampleInfo``), which fall behind a Python loop that launches kernels
        at 20 µs intervals. Images then live in anonymous shared memory (``memfd``, reserved up front; see :mod:`gpuscope._pm_sampling.shm`), which
        nothing outlives.
    kernels : bool, optional
        Also record every kernel that runs on the device while sampling, with its start and end on the GPU
        (CUPTI's concurrent-kernel activity records; kernels are not serialised), default False. They are the
        execution table of the Dataset (:func:`gpuscope.kernel_executions`), drawn by :func:`gpuscope.to_perfetto`
        and used by ``gpuscope.dynamic(td, phases=...)`` to give each phase the Top-Down of its kernels. The device
        is synchronised when sampling stops so that every kernel has its end.

    Returns
    -------
    Sampler or MultiSampler
        A context manager; ``.dataset`` after the block holds the samples: dim ``time`` for one device; for
        several (a :class:`~gpuscope.MultiSampler`), dims ``device`` and ``sample`` with each device's sample
        times as (device, sample) coordinates on one clock, and ``.datasets`` each device's own.

    Raises
    ------
    TypeError, ValueError
        A bad argument (raised here, before any CUDA or CUPTI work; the message names the argument, the value and
        what is allowed): an interval below 1 µs or not a whole number of ns (or cycles), a ``decode_period``
        below 1 ms; an interval in cycles on a chip that samples on a time interval (raised on start). For several
        devices: a device list that is empty, repeats a device or holds a non-integer raises ValueError here (a value
        of the wrong kind, such as a str other than ``"all"``, is also a TypeError), and a device this process does
        not see raises ValueError on start, before any device's sampler starts.
    SamplerBusyError, NotSinglePassError, UnknownMetricError, CuptiPermissionError, ProfilerBusyError
        On start: see :meth:`Sampler.start`.

    Examples
    --------
    >>> with gpuscope.sample(metrics="pm-default", interval="100us") as s:
    ...     with gpuscope.range("solve"):
    ...         run_simulation()
    >>> ts = s.dataset             # dims: time; coords start_ns, end_ns, range

    Every GPU of the process at once:

    >>> with gpuscope.sample(device="all") as s:
    ...     run_on_two_gpus()
    >>> both = s.dataset           # dims: device, sample; coords time, start_ns, end_ns, range (device, sample)
    >>> ph = gpuscope.phases(gpuscope.select_device(both, 1))
    """
    if isinstance(device, (str, Iterable)):
        return MultiSampler(metrics, interval, device, **options)
    return Sampler(metrics, interval, device, **options)
