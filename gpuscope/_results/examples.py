"""``gpuscope.example_dataset``: the recordings shipped with gpuscope, opened by name (as ``xarray.tutorial``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["EXAMPLES", "example_dataset"]

_DATA = Path(__file__).resolve().parents[1] / "data"
#: name -> what the recording is (each ``gpuscope/data/<name>.nc``, recorded on an H100 80GB HBM3).
EXAMPLES = {
    "demo_launches": "range results, kernel mode, the topdown set: 15 launches of three Numba kernels "
                     "(stream, fma, divergent)",
    "demo_timeseries": "PM samples every 100 us over the same three kernels (18,019 samples)",
}


def example_dataset(name: str):
    """One of the recordings shipped with gpuscope, opened with :func:`gpuscope.open_dataset`: data to try every
    analysis, plot and report on a machine without a GPU. Reads a file of the package; needs no GPU, network or CUPTI.

    Parameters
    ----------
    name : str
        ``"demo_launches"`` (range results of the ``topdown`` set, one row per launch) or ``"demo_timeseries"``
        (PM samples); a trailing ``.nc`` is accepted.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    ValueError
        *name* is not one of the shipped recordings (the message lists them).

    Examples
    --------
    >>> import gpuscope as gs
    >>> ds = gs.example_dataset("demo_launches")
    >>> ds.sizes["range"]
    15
    """
    from gpuscope._results.io import open_dataset

    stem = str(name).removesuffix(".nc")
    if stem not in EXAMPLES:
        shipped = "; ".join(f"{n!r}: {what}" for n, what in EXAMPLES.items())
        raise ValueError(f"no example dataset named {name!r}; gpuscope ships {shipped}")
    return open_dataset(_DATA / f"{stem}.nc")
