"""Memory workload analysis of range results: bytes, requests, hit rates and busy share per level of the hierarchy.

Nsight Compute's Memory Workload Analysis and its memory chart, from the ``memory`` set, per range (or per group
with ``by=``, rows combined by :mod:`gpuscope.metrics.combine`). Levels, from the SM outwards:

``L1/TEX``
    global and local loads and stores through the L1/TEX cache: requests (``l1tex__t_requests_pipe_lsu_mem_*``),
    bytes (``l1tex__t_bytes_pipe_lsu_mem_*``), hit rate ``l1tex__t_sectors_lookup_hit / l1tex__t_sectors``.
``shared``
    shared memory, which lives in the same SRAM: requests are the shared load and store instructions, bytes
    ``smsp__sass_data_bytes_mem_shared.sum``; bank conflicts and wavefronts are their own variables.
``L2``
    what L1/TEX asks of L2 (``lts__t_requests_srcunit_tex_op_read/write``, and their sectors times the sector
    size), hit rate ``lts__t_sectors_lookup_hit / lts__t_sectors`` (every L2 client).
``DRAM``
    ``dram__bytes_read.sum`` and ``dram__bytes_write.sum``.
``system``
    L2 sectors read and written in system memory (``lts__t_sectors_aperture_sysmem_op_read/write``).

The sector size is the chip's: ``lts__t_bytes.sum.peak_sustained / lts__t_sectors.sum.peak_sustained`` (32 bytes on
every chip CUPTI 13.1 lists). ``busy`` is each unit's work over its capacity during the range, from the
counters' own ``.peak_sustained``: L1/TEX the larger of its tag stage (``l1tex__t_bytes``) and data stage
(``l1tex__data_pipe_lsu_wavefronts``), shared its wavefronts on that data stage, L2 ``lts__t_bytes``, DRAM its
bytes; capacity = peak per cycle x the unit's clock x the duration. ``busiest_level`` is the level nearest its
peak: for a memory-bound kernel (Top-Down ``backend_memory``), the level that bounds it. ncu's "Mem Busy" takes the
largest of more sub-unit throughputs (``*__throughput`` metrics, 9 passes with ``speed-of-light``); these shares
need none of them.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope.metrics.combine import DURATION, along, combine, metric, plain, require

__all__ = ["LEVELS", "SPACES", "memory_workload"]

_SET = "memory"
#: The levels of the memory hierarchy, from the SM outwards.
LEVELS = ("L1/TEX", "shared", "L2", "DRAM", "system")
#: Memory spaces the kernel's load and store instructions address.
SPACES = ("global", "local", "shared")

_L1_CLOCK, _L2_CLOCK, _DRAM_CLOCK = (f"{u}__cycles_elapsed.avg.per_second" for u in ("l1tex", "lts", "dram"))
_INST = "smsp__sass_inst_executed_op_{}_{}.sum"
_L1 = "l1tex__t_{}_pipe_lsu_mem_{}_op_{}.sum"
_SHARED_WAVEFRONTS = ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
                      "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum")
_BANK_CONFLICTS = ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                   "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum")

_ATTRS = {
    "read_bytes": ("byte", "bytes read at the level ('shared': NaN, the counter does not split reads and writes)"),
    "write_bytes": ("byte", "bytes written at the level"),
    "bytes": ("byte", "bytes read and written at the level"),
    "bandwidth": ("byte/second", "bytes per second at the level"),
    "requests": ("request", "requests to the level (L1/TEX and L2: the unit's requests; shared: the load and store "
                            "instructions); NaN for DRAM and system memory"),
    "hit_rate": ("percent", "sectors found in the cache, of those looked up (L1/TEX and L2 only)"),
    "busy": ("percent", "the unit's work over its capacity during the range, from its counters' own peaks"),
    "busiest_level": ("", "the level nearest its peak"),
    "busiest_share": ("percent", "that level's busy share"),
    "load_instructions": ("instruction", "warp load instructions per memory space"),
    "store_instructions": ("instruction", "warp store instructions per memory space"),
    "l1_requests": ("request", "L1/TEX requests per memory space (loads and stores; NaN for shared)"),
    "l1_bytes": ("byte", "L1/TEX bytes per memory space (loads and stores; NaN for shared)"),
    "shared_wavefronts": ("wavefront", "shared-memory wavefronts on the L1 data stage (loads and stores)"),
    "shared_bank_conflicts": ("conflict", "shared-memory bank conflicts (loads and stores)"),
    "sector_bytes": ("byte", "bytes in an L2 sector on this chip"),
}


def _add(*values):
    return sum(values[1:], values[0])


def _per_level(values: dict, like: xr.DataArray) -> xr.DataArray:
    """One DataArray along (row, level) from level -> value, NaN for the levels not given."""
    parts = [along(values.get(level, np.nan), like) for level in LEVELS]
    return xr.concat(parts, xr.DataArray(list(LEVELS), dims="level"), coords="minimal")


def memory_workload(ds: xr.Dataset, by: str | None = None, dim: str = "range") -> xr.Dataset:
    """Bytes, requests, hit rates and the busy share of each memory level, per range or group of ranges.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results holding the ``memory`` set.
    by : str, optional
        Combine the ranges of each value of this coordinate first (``"kernel"``).
    dim : str
        The dimension of the ranges.

    Returns
    -------
    xarray.Dataset
        Along the rows and ``level`` (:data:`LEVELS`): ``read_bytes``, ``write_bytes``, ``bytes``, ``bandwidth``,
        ``requests``, ``hit_rate``, ``busy``; along the rows and ``space`` (:data:`SPACES`): ``load_instructions``,
        ``store_instructions``, ``l1_requests``, ``l1_bytes``; along the rows: ``busiest_level``, ``busiest_share``, ``shared_wavefronts``,
        ``shared_bank_conflicts``, ``sector_bytes``. NaN where the chip has no counter for a cell (DRAM on Tegra
        parts). Units and descriptions in each variable's attrs; row coordinates and Dataset attrs kept.

    Raises
    ------
    TypeError
        *ds* is not a Dataset.
    ValueError
        *by* or *dim* is not in *ds*.
    gpuscope.errors.MissingMetricsError
        The Dataset lacks the duration or the L1/TEX counters (it holds no ``memory`` set).
    """
    ds = combine(ds, by, dim)
    row = by or dim
    core = require(ds, [DURATION, _L1.format("bytes", "global", "ld"), _L1.format("bytes", "global", "st"),
                        _L1_CLOCK, "l1tex__t_bytes.sum", "l1tex__t_bytes.sum.peak_sustained"], _SET,
                   "the memory workload analysis")
    seconds = plain(core[DURATION]) * 1e-9

    def m(name):  # the metric (or its stand-in), NaN where the chip left it out
        value = metric(ds, name, _SET)
        return np.nan if value is None else plain(value)

    with np.errstate(divide="ignore", invalid="ignore"):
        sector = m("lts__t_bytes.sum.peak_sustained") / m("lts__t_sectors.sum.peak_sustained")
        read = {"L1/TEX": _add(*(m(_L1.format("bytes", s, "ld")) for s in ("global", "local"))),
                "L2": m("lts__t_sectors_srcunit_tex_op_read.sum") * sector,
                "DRAM": m("dram__bytes_read.sum"),
                "system": m("lts__t_sectors_aperture_sysmem_op_read.sum") * sector}
        write = {"L1/TEX": _add(*(m(_L1.format("bytes", s, "st")) for s in ("global", "local"))),
                 "L2": m("lts__t_sectors_srcunit_tex_op_write.sum") * sector,
                 "DRAM": m("dram__bytes_write.sum"),
                 "system": m("lts__t_sectors_aperture_sysmem_op_write.sum") * sector}
        read_bytes, write_bytes = _per_level(read, seconds), _per_level(write, seconds)
        shared_bytes = along(m("smsp__sass_data_bytes_mem_shared.sum"), seconds)
        total = (read_bytes + write_bytes).where(read_bytes["level"] != "shared", shared_bytes)
        requests = _per_level({
            "L1/TEX": _add(*(m(_L1.format("requests", s, o)) for s in ("global", "local") for o in ("ld", "st"))),
            "shared": m(_INST.format("shared", "ld")) + m(_INST.format("shared", "st")),
            "L2": m("lts__t_requests_srcunit_tex_op_read.sum") + m("lts__t_requests_srcunit_tex_op_write.sum"),
        }, seconds)
        hit_rate = _per_level({
            "L1/TEX": 100 * m("l1tex__t_sectors_lookup_hit.sum") / m("l1tex__t_sectors.sum"),
            "L2": 100 * m("lts__t_sectors_lookup_hit.sum") / m("lts__t_sectors.sum"),
        }, seconds)
        l1_cycles, l2_cycles = m(_L1_CLOCK) * seconds, m(_L2_CLOCK) * seconds
        data_stage = m("l1tex__data_pipe_lsu_wavefronts.sum.peak_sustained") * l1_cycles
        wavefronts = _add(*(m(n) for n in _SHARED_WAVEFRONTS))
        busy = _per_level({
            "L1/TEX": 100 * np.fmax(m("l1tex__t_bytes.sum") / (m("l1tex__t_bytes.sum.peak_sustained") * l1_cycles),
                                    m("l1tex__data_pipe_lsu_wavefronts.sum") / data_stage),
            "shared": 100 * wavefronts / data_stage,
            "L2": 100 * m("lts__t_bytes.sum") / (m("lts__t_bytes.sum.peak_sustained") * l2_cycles),
            "DRAM": 100 * (m("dram__bytes_read.sum") + m("dram__bytes_write.sum"))
            / (m("dram__bytes_read.sum.peak_sustained") * m(_DRAM_CLOCK) * seconds),
        }, seconds)
        bandwidth = total / seconds
    known = busy.notnull().any("level")
    busiest = busy.fillna(-np.inf).argmax("level")
    busiest_level = xr.DataArray(np.asarray(LEVELS)[busiest.values], dims=busiest.dims, coords=busiest.coords)
    spaces = xr.DataArray(list(SPACES), dims="space")
    loads = xr.concat([along(m(_INST.format(s, "ld")), seconds) for s in SPACES], spaces, coords="minimal")
    stores = xr.concat([along(m(_INST.format(s, "st")), seconds) for s in SPACES], spaces, coords="minimal")
    through_l1 = [s for s in SPACES if s != "shared"]  # shared memory does not go through the L1/TEX cache's tags
    l1_requests = xr.concat([along(_add(*(m(_L1.format("requests", s, o)) for o in ("ld", "st"))), seconds)
                             for s in through_l1], xr.DataArray(through_l1, dims="space"), coords="minimal")
    l1_bytes = xr.concat([along(_add(*(m(_L1.format("bytes", s, o)) for o in ("ld", "st"))), seconds)
                          for s in through_l1], xr.DataArray(through_l1, dims="space"), coords="minimal")
    out = xr.Dataset({
        "read_bytes": read_bytes, "write_bytes": write_bytes, "bytes": total, "bandwidth": bandwidth,
        "requests": requests, "hit_rate": hit_rate, "busy": busy,
        "busiest_level": busiest_level.where(known, "").astype(str), "busiest_share": busy.max("level"),
        "load_instructions": loads, "store_instructions": stores,
        "l1_requests": l1_requests.reindex(space=list(SPACES)), "l1_bytes": l1_bytes.reindex(space=list(SPACES)),
        "shared_wavefronts": along(wavefronts, seconds),
        "shared_bank_conflicts": along(_add(*(m(n) for n in _BANK_CONFLICTS)), seconds),
        "sector_bytes": along(sector, seconds),
    })
    out = out.assign_coords({n: c for n, c in ds.coords.items() if c.dims == (row,)}).transpose(row, ...)
    for name, (units, description) in _ATTRS.items():
        out[name].attrs = {"units": units, "description": description} if units else {"description": description}
    out.attrs = dict(ds.attrs)
    return out
