"""Occupancy and launch statistics: theoretical occupancy with its limiter, achieved occupancy, waves and tail.

Nsight Compute's Occupancy and Launch Statistics sections. The theoretical occupancy follows CUDA's occupancy
calculator (``cuda_occupancy.h``): a block of ``T`` threads is ``W = ceil(T / 32)`` warps, and the blocks an SM
holds are the fewest that four limits allow:

``warps``
    ``floor(max_warps / W)``: the block size against the warps an SM holds.
``blocks``
    the blocks an SM holds at most.
``registers``
    registers are given to warps in units of 256, and each of the SM's sub-partitions has its own part of the
    register file: ``floor(floor(R_sm / P / ceil(32 r, 256)) * P / W)`` for ``r`` registers per thread and ``P``
    sub-partitions; 0 when the block's ``ceil(32 r, 256) * ceil(W, P)`` registers exceed a block's limit.
``shared_memory``
    ``floor(C / ceil(s + reserved, unit))`` for ``s`` bytes per block (static and dynamic), the bytes the system
    reserves per block (1 KiB from compute capability 8.0) and the allocation unit (128 bytes from CC 8.0, 256
    before). ``C`` is the shared memory the driver configured the SM with for the launch (ncu's
    ``launch__shared_mem_config_size``), one of the sizes the architecture allows (0, 8, 16, 32, 64, 100, ... 228
    KiB on Hopper). Given as ``shared_memory_config``, it is used as is; otherwise it is estimated as the driver
    picks it: the smallest size that holds the blocks the other three limits allow, and no less than
    :data:`DRIVER_MIN_SHARED_MEMORY`. That is ncu's "Block Limit Shared Mem" (CUDA's calculator counts the largest
    size instead, which never changes the occupancy but shows 228 blocks for a kernel without shared memory).

``limited_by`` names the limits that give the minimum (several where they tie, in that order); shared memory only
where it holds fewer blocks than the other limits allow, or no more even at the SM's largest size (the driver sizes
it to the others where it can). The theoretical occupancy is ``blocks x W / max_warps``; the achieved one is
``sm__warps_active.avg.pct_of_peak_sustained_active``.
A *wave* is ``blocks per SM x SMs`` blocks: ``waves_per_sm = grid / wave``; a last, partial wave of ``tail_blocks``
takes as long as a full one if blocks take equal time, so it is ``tail_share`` = 1 / ceil(waves) of the runtime
(ncu's tail-effect rule), run at ``tail_utilization`` of the GPU's block slots.

Limits come from the Dataset: the warps and blocks an SM holds from the ``occupancy`` set's own counters
(``sm__warps_active.avg.peak_sustained``, ``sm__ctas_active.avg.peak_sustained``), the register file, shared memory
and SM count from the device attrs a session records (:data:`gpuscope._schema.dataset.SM_LIMIT_ATTRS`,
``sm_count``), the sub-partitions and shared-memory sizes from the chip's table
(:mod:`gpuscope.metrics.architectures`); ``limits=`` overrides any of them. The registers and shared memory of
each launch come from the Dataset where the session recorded them: kernel, iteration and auto modes ask the driver
for each launched function's registers per thread and static shared memory and keep the launch's dynamic shared
memory, in the range coords ``registers_per_thread``, ``shared_memory_static`` and ``shared_memory_dynamic``
(:data:`gpuscope._schema.dataset.RESOURCE_COORDS`; -1 for user ranges). Otherwise, and over them, they come from
the caller: Numba's ``kernel.get_regs_per_thread()`` and ``get_shared_mem_per_block()``, CuPy's
``kernel.attributes``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import xarray as xr

from gpuscope._schema.dataset import SM_LIMIT_ATTRS
from gpuscope._util import validate as _validate
from gpuscope.errors import MissingMetricsError
from gpuscope.metrics import architectures as _arch

__all__ = ["LIMITERS", "DRIVER_MIN_SHARED_MEMORY", "SMLimits", "sm_limits", "driver_shared_memory",
           "theoretical_occupancy", "recorded_resources", "occupancy"]

#: The limits on blocks per SM, in the order ties are named.
LIMITERS = ("registers", "shared_memory", "warps", "blocks")
ACHIEVED = "sm__warps_active.avg.pct_of_peak_sustained_active"
ACHIEVED_WARPS = "sm__warps_active.avg.per_cycle_active"
MAX_WARPS = "sm__warps_active.avg.peak_sustained"
MAX_BLOCKS = "sm__ctas_active.avg.peak_sustained"
BLOCKS_LAUNCHED = "sm__ctas_launched.sum"
SM_ACTIVE, SM_ELAPSED = "sm__cycles_active.avg", "sm__cycles_elapsed.avg"
#: The range coords in which a session records each launch's registers per thread and its static and dynamic shared
#: memory per block (:data:`gpuscope._schema.dataset.RESOURCE_COORDS`).
REGISTERS, SHARED_STATIC, SHARED_DYNAMIC = "registers_per_thread", "shared_memory_static", "shared_memory_dynamic"
WARP_SIZE = 32
#: Registers are given to a warp in units of this many (every architecture CUPTI profiles).
REGISTER_UNIT = 256
#: The least shared memory (bytes per SM) the driver configures for a launch, what it needs or not: the CUDA 13.0
#: driver on an H200 configured 32 KiB for every launch of tests/fixtures/sol that needed 8 or 9 KiB (ncu's
#: launch__shared_mem_config_size), not the 8 or 16 KiB Hopper allows. Other drivers may configure less; pass the
#: size a launch got as ``shared_memory_config``.
DRIVER_MIN_SHARED_MEMORY = 32 << 10


@dataclasses.dataclass(frozen=True)
class SMLimits:
    """What one SM holds, and how it hands out registers and shared memory.

    Attributes
    ----------
    max_warps, max_blocks : int
        Warps and blocks resident per SM at most.
    registers : int
        32-bit registers per SM.
    block_registers : int
        Registers one block may use at most.
    shared_memory : int
        Bytes of shared memory an SM can be configured with at most.
    reserved_shared_memory : int
        Bytes the system reserves per block.
    shared_memory_unit : int
        Shared memory is given to blocks in multiples of this many bytes.
    sub_partitions : int
        SM sub-partitions, each with its part of the register file.
    sm_count : int
        SMs of the GPU (for waves); 0 where unknown.
    shared_memory_sizes : tuple of int
        Every size (bytes) an SM's shared memory can be configured with for a launch, smallest first; empty where
        unknown (then only *shared_memory*).
    """

    max_warps: int
    max_blocks: int
    registers: int
    block_registers: int
    shared_memory: int
    reserved_shared_memory: int = 0
    shared_memory_unit: int = 128
    sub_partitions: int = 4
    sm_count: int = 0
    shared_memory_sizes: tuple[int, ...] = ()


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def driver_shared_memory(need: int, limits: SMLimits) -> int:
    """The shared memory (bytes per SM) the driver configures for a launch, as estimated from what it needs.

    Parameters
    ----------
    need : int
        Bytes the blocks that the other limits let an SM hold take, reserved bytes and allocation unit included.
    limits : SMLimits
        The SM's sizes (``shared_memory_sizes``, up to ``shared_memory``).

    Returns
    -------
    int
        The smallest size that holds *need*, no less than :data:`DRIVER_MIN_SHARED_MEMORY`; the largest where none
        does (the blocks then are limited by shared memory).
    """
    sizes = sorted({s for s in limits.shared_memory_sizes if s <= limits.shared_memory} | {limits.shared_memory})
    return next((s for s in sizes if s >= max(need, DRIVER_MIN_SHARED_MEMORY)), limits.shared_memory)


def _register_limit(warps: int, registers: int, limits: SMLimits) -> int:
    per_warp = _round_up(registers * WARP_SIZE, REGISTER_UNIT)
    if per_warp == 0:
        return limits.max_blocks
    if per_warp * _round_up(warps, limits.sub_partitions) > limits.block_registers:
        return 0  # the block cannot launch
    return (limits.registers // limits.sub_partitions) // per_warp * limits.sub_partitions // warps


def theoretical_occupancy(threads: int, registers: int, shared_memory: int, limits: SMLimits,
                          shared_memory_config: int | None = None) -> dict:
    """Blocks per SM and theoretical occupancy of a block of *threads* threads using *registers* registers per
    thread and *shared_memory* bytes of shared memory (static + dynamic), as CUDA's occupancy calculator and
    Nsight Compute count them.

    *shared_memory_config* is the shared memory (bytes per SM) the driver configured for the launch; without it,
    the driver's choice is estimated (:func:`driver_shared_memory`).

    Returns
    -------
    dict
        ``limits`` (limiter -> blocks per SM it allows), ``blocks`` (the minimum), ``limiter`` (the limits that give
        it, joined by ``"+"``), ``warps`` (resident warps per SM), ``occupancy`` (percent of ``max_warps``) and
        ``shared_memory_config`` (the configured size the shared-memory limit counts).

    Raises
    ------
    ValueError
        *threads* is not positive, or *registers*, *shared_memory* or *shared_memory_config* is negative.
    """
    if threads <= 0 or registers < 0 or shared_memory < 0 or (shared_memory_config or 0) < 0:
        raise ValueError(f"threads must be positive and registers, shared memory not negative; got threads={threads}, "
                         f"registers={registers}, shared_memory={shared_memory}, "
                         f"shared_memory_config={shared_memory_config}")
    warps = -(-threads // WARP_SIZE)
    by = {"warps": limits.max_warps // warps, "blocks": limits.max_blocks,
          "registers": _register_limit(warps, registers, limits)}
    others = min(by.values())
    per_block = _round_up(shared_memory + limits.reserved_shared_memory, limits.shared_memory_unit)
    config = driver_shared_memory(others * per_block, limits) if shared_memory_config is None else shared_memory_config
    by["shared_memory"] = config // per_block if per_block else limits.max_blocks
    ordered = {k: int(by[k]) for k in LIMITERS}
    blocks = min(ordered.values())
    # the driver sizes shared memory to the other limits where it can: a tie there is not shared memory's doing
    smem_limits = per_block > 0 and (by["shared_memory"] < others or limits.shared_memory // per_block <= blocks)
    limiter = "+".join(k for k in LIMITERS if ordered[k] == blocks and (k != "shared_memory" or smem_limits))
    return {"limits": ordered, "blocks": blocks, "limiter": limiter, "warps": blocks * warps,
            "occupancy": 100.0 * blocks * warps / limits.max_warps, "shared_memory_config": int(config)}


def sm_limits(ds: xr.Dataset, limits=None) -> SMLimits:
    """The SM limits of the GPU that recorded *ds* (see the module docstring), *limits* (an :class:`SMLimits` or a
    mapping of its field names) overriding what the Dataset says.

    Raises
    ------
    ValueError
        *limits* names a field :class:`SMLimits` does not have.
    MissingMetricsError
        A limit is neither in the Dataset nor in *limits*; the message names the attrs and fields to give.
    """
    if isinstance(limits, SMLimits):
        return limits
    given = dict(limits or {})
    unknown = set(given) - {f.name for f in dataclasses.fields(SMLimits)}
    if unknown:
        fields = [f.name for f in dataclasses.fields(SMLimits)]
        raise ValueError(f"limits has no fields {sorted(unknown)}; fields: {fields}")
    attrs = ds.attrs

    def first(*values):
        return next((int(v) for v in values if v is not None and np.isfinite(v)), None)

    def peak(name):
        return float(np.nanmax(np.asarray(ds[name]))) if name in ds.data_vars else None

    threads = attrs.get("sm_max_threads")
    found = {
        "max_warps": first(peak(MAX_WARPS), None if threads is None else threads // WARP_SIZE),
        "max_blocks": first(peak(MAX_BLOCKS), attrs.get("sm_max_blocks")),
        "registers": first(attrs.get("sm_registers")),
        "block_registers": first(attrs.get("block_max_registers")),
        "shared_memory": first(attrs.get("sm_shared_memory_bytes")),
        "reserved_shared_memory": first(attrs.get("block_reserved_shared_memory_bytes")),
        "sm_count": first(attrs.get("sm_count")),
    }
    cc = attrs.get("compute_capability")
    chip = attrs.get("chip")
    try:
        table = _arch.architecture(chip if chip else cc) if (chip or cc) else None
    except _arch.UnknownChipError:
        table = None
    if table is not None:
        found["sub_partitions"] = table.smsp_per_sm
        found["shared_memory_unit"] = 128 if table.cc_min >= (8, 0) else 256
        found["shared_memory_sizes"] = tuple(kib << 10 for kib in table.shared_memory_kib)
    found = {k: v for k, v in found.items() if v is not None}
    found.update(given)
    missing = [f.name for f in dataclasses.fields(SMLimits) if f.default is dataclasses.MISSING and f.name not in found]
    if missing:
        raise MissingMetricsError(
            f"the occupancy needs the SM limits {missing}: the Dataset has neither the occupancy set's "
            f"{MAX_WARPS}/{MAX_BLOCKS} nor the device attrs {sorted(SM_LIMIT_ATTRS)} (a session records them; "
            "older recordings lack them). Pass limits={...} with those fields (SMLimits).", (MAX_WARPS, MAX_BLOCKS))
    return SMLimits(**found)


def _per_row(value, ds: xr.Dataset, dim: str, what: str) -> np.ndarray:
    """*value* (a number, a mapping kernel name -> number, or a DataArray along *dim*) as one float per row."""
    n = ds.sizes[dim]
    if isinstance(value, xr.DataArray):
        if value.dims != (dim,) or value.sizes[dim] != n:
            raise ValueError(f"{what} as a DataArray must be along {dim!r} with {n} values; got {dict(value.sizes)}")
        return np.asarray(value, dtype=float)
    if isinstance(value, Mapping):
        if "kernel" not in ds.coords:
            raise ValueError(f"{what} given per kernel, but the Dataset has no 'kernel' coordinate")
        kernels = [str(k) for k in np.asarray(ds["kernel"])]
        return np.array([float(value[k]) if k in value else np.nan for k in kernels])
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return np.full(n, float(value))
    raise TypeError(f"{what} must be a number, a mapping kernel -> number or a DataArray along {dim!r}; "
                    f"got {type(value).__name__}")


def _given(value, recorded: np.ndarray | None, ds: xr.Dataset, dim: str, what: str) -> np.ndarray | None:
    """One float per row: *value* (as :func:`_per_row` reads it) where it gives one, else *recorded*; *recorded*
    where *value* is None."""
    if value is None:
        return recorded
    given = _per_row(value, ds, dim, what)
    return given if recorded is None else np.where(np.isfinite(given), given, recorded)


def _shape(ds: xr.Dataset, what: str, dim: str) -> np.ndarray | None:
    axes = [f"{what}_{a}" for a in "xyz"]
    if not all(a in ds.coords for a in axes):
        return None
    size = np.prod([np.asarray(ds[a], dtype=float) for a in axes], axis=0)
    return np.where(size > 0, size, np.nan)


def _recorded(ds: xr.Dataset, name: str, dim: str) -> np.ndarray | None:
    """The range coord *name* as one float per row, NaN where it is -1 (unknown); None where *ds* lacks it."""
    if name not in ds.coords or ds[name].dims != (dim,):
        return None
    values = np.asarray(ds[name], dtype=float)
    return np.where(values >= 0, values, np.nan)


def recorded_resources(ds: xr.Dataset, dim: str = "range") -> tuple[np.ndarray | None, np.ndarray | None]:
    """The registers per thread and the shared memory per block (static + dynamic) that the session recorded for
    each row of *ds* (:data:`REGISTERS`, :data:`SHARED_STATIC`, :data:`SHARED_DYNAMIC`), as floats.

    Registers are NaN where a row has -1 (a user range, a function the driver could not be asked about); a part of
    the shared memory that a row does not know counts 0, as the shared memory does where nothing is recorded. Either
    is None where the Dataset lacks its coords (recorded before gpuscope kept them).
    """
    registers = _recorded(ds, REGISTERS, dim)
    static, dynamic = _recorded(ds, SHARED_STATIC, dim), _recorded(ds, SHARED_DYNAMIC, dim)
    if static is None and dynamic is None:
        return registers, None
    n = ds.sizes[dim]
    static = np.zeros(n) if static is None else np.nan_to_num(static, nan=0.0)
    dynamic = np.zeros(n) if dynamic is None else np.nan_to_num(dynamic, nan=0.0)
    return registers, static + dynamic


def occupancy(ds: xr.Dataset, registers=None, shared_memory=None, limits=None, dim: str = "range",
              shared_memory_config=None) -> xr.Dataset:
    """Theoretical and achieved occupancy, waves and tail of each launch.

    A session in kernel, iteration or auto mode records each launch's registers per thread and its static and
    dynamic shared memory per block (the coords ``registers_per_thread``, ``shared_memory_static`` and
    ``shared_memory_dynamic``), so ``gs.occupancy(ds)`` needs no arguments for its launches; user ranges have -1
    there, and files recorded before gpuscope kept them lack the coords: give *registers* (and *shared_memory*) for
    those.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results (kernel launches, with ``block_*`` and ``grid_*`` coordinates), best with the ``occupancy``
        set (achieved occupancy, the SM's warp and block limits).
    registers : int, mapping or DataArray, optional
        Registers per thread: one number, ``{kernel name: registers}``, or one value per range. Given values win
        over the Dataset's ``registers_per_thread``; rows they leave out (a kernel the mapping does not name, NaN)
        take the Dataset's value where it has one (not -1). By default the Dataset's value; a row without one gets
        NaN.
    shared_memory : int, mapping or DataArray, optional
        Bytes of shared memory per block (static + dynamic), given as *registers* is, and winning over the Dataset
        as *registers* does. By default ``shared_memory_static + shared_memory_dynamic`` of the Dataset (a part it
        does not know, -1, counts 0), or 0 where it lacks those coords.
    limits : SMLimits or mapping, optional
        The SM's limits, or some of them (field names of :class:`SMLimits`) over what the Dataset records.
    dim : str
        The dimension of the ranges.
    shared_memory_config : int, mapping or DataArray, optional
        The shared memory (bytes per SM) the driver configured for each launch (ncu's
        ``launch__shared_mem_config_size``), given as *registers* is; by default estimated as the driver picks it
        (:func:`driver_shared_memory`).

    Returns
    -------
    xarray.Dataset
        Along *dim*: ``threads_per_block``, ``grid_blocks``, ``registers``, ``shared_memory``,
        ``shared_memory_config``, ``block_limit``
        (and along ``limit``: :data:`LIMITERS`), ``blocks_per_sm``, ``limited_by``, ``theoretical_warps``,
        ``theoretical_occupancy``, ``achieved_warps`` and ``achieved_occupancy`` (NaN without the ``occupancy``
        set), ``sm_active`` (percent of elapsed SM cycles that were active), ``waves_per_sm``, ``tail_blocks``,
        ``tail_share``, ``tail_utilization``. NaN (and ``limited_by`` ``""``) where a row has no block shape (a
        user range) or no registers. Row coordinates and Dataset attrs kept.

    Raises
    ------
    TypeError
        *ds* is not a Dataset, or *registers* / *shared_memory* is of the wrong kind.
    ValueError
        *dim* is not in *ds*, or the per-row values do not match its length.
    gpuscope.errors.MissingMetricsError
        *registers* is not given and no row of the Dataset records them (user ranges, older files), or the SM
        limits are not known (see :func:`sm_limits`).

    Examples
    --------
    >>> with gs.Profiler("occupancy", mode="kernel") as prof:            # doctest: +SKIP
    ...     run()
    >>> gs.occupancy(prof.dataset)[["theoretical_occupancy", "limited_by", "waves_per_sm"]]   # doctest: +SKIP
    """
    ds = _validate.dataset(ds, "ds")
    if dim not in ds.dims:
        raise ValueError(f"the Dataset has no dimension {dim!r} (dims: {list(ds.dims)})")
    recorded_regs, recorded_smem = recorded_resources(ds, dim)
    if registers is None and (recorded_regs is None or not np.isfinite(recorded_regs).any()):
        what = ("none is recorded (registers_per_thread is -1: user ranges, or functions the driver could not be "
                "asked about)" if recorded_regs is not None else
                "the Dataset does not record them (recorded before gpuscope kept registers_per_thread)")
        raise MissingMetricsError(f"the theoretical occupancy needs the registers per thread of each kernel, and "
                                  f"{what}. A session in kernel, iteration or auto mode records them for each "
                                  "launch; otherwise pass registers= (Numba: kernel.get_regs_per_thread(); CuPy: "
                                  "kernel.attributes['num_regs'])", ())
    lim = sm_limits(ds, limits)
    n = ds.sizes[dim]
    regs = _given(registers, recorded_regs, ds, dim, "registers")
    smem = _given(shared_memory, recorded_smem, ds, dim, "shared_memory")
    if smem is None:
        smem = np.zeros(n)
    config = np.full(n, np.nan) if shared_memory_config is None else _per_row(
        shared_memory_config, ds, dim, "shared_memory_config")
    threads = _shape(ds, "block", dim)
    threads = np.full(n, np.nan) if threads is None else threads
    grid = _shape(ds, "grid", dim)
    if grid is None and BLOCKS_LAUNCHED in ds.data_vars:
        grid = np.asarray(ds[BLOCKS_LAUNCHED], dtype=float)
    grid = np.full(n, np.nan) if grid is None else grid
    table = np.full((n, len(LIMITERS)), np.nan)
    blocks, warps, occ = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    configured = np.full(n, np.nan)
    limiter = np.full(n, "", dtype=object)
    for i in range(n):
        if not (np.isfinite(threads[i]) and np.isfinite(regs[i]) and np.isfinite(smem[i])):
            continue
        given = int(config[i]) if np.isfinite(config[i]) else None
        t = theoretical_occupancy(int(threads[i]), int(regs[i]), int(smem[i]), lim, shared_memory_config=given)
        table[i] = [t["limits"][k] for k in LIMITERS]
        blocks[i], warps[i], occ[i], limiter[i] = t["blocks"], t["warps"], t["occupancy"], t["limiter"]
        configured[i] = t["shared_memory_config"]
    with np.errstate(divide="ignore", invalid="ignore"):
        wave = blocks * lim.sm_count if lim.sm_count else np.full(n, np.nan)
        waves = grid / wave
        full = np.floor(waves)
        tail = grid - full * wave
        tail_share = np.where(tail > 0, 1.0 / np.ceil(waves), 0.0)
        tail_share = np.where(np.isfinite(waves) & (wave > 0), tail_share, np.nan)
        tail_utilization = np.where(tail > 0, 100.0 * tail / wave, np.nan)

    def row_var(values, units, description):
        attrs = {"units": units, "description": description} if units else {"description": description}
        return xr.DataArray(values, dims=dim, attrs=attrs)

    def measured(name, units, description):
        values = np.asarray(ds[name], dtype=float) if name in ds.data_vars else np.full(n, np.nan)
        return row_var(values, units, description)

    sm_active = np.full(n, np.nan)
    if SM_ACTIVE in ds.data_vars and SM_ELAPSED in ds.data_vars:
        with np.errstate(divide="ignore", invalid="ignore"):
            sm_active = 100.0 * np.asarray(ds[SM_ACTIVE], dtype=float) / np.asarray(ds[SM_ELAPSED], dtype=float)
    out = xr.Dataset({
        "threads_per_block": row_var(threads, "thread", "threads per block"),
        "grid_blocks": row_var(grid, "block", "blocks in the grid"),
        "registers": row_var(regs, "register/thread", "registers per thread the code uses (given, or as the "
                             "session recorded them from the driver)"),
        "registers_allocated": row_var(np.ceil(np.asarray(regs, dtype=float) * WARP_SIZE / REGISTER_UNIT)
                                       * REGISTER_UNIT / WARP_SIZE, "register/thread",
                                       f"registers per thread the SM allocates: the used ones rounded up to its unit "
                                       f"of {REGISTER_UNIT} a warp (ncu's launch__registers_per_thread)"),
        "shared_memory": row_var(smem, "byte/block", "shared memory per block, static and dynamic (given, or as the "
                                 "session recorded it)"),
        "shared_memory_config": row_var(configured, "byte", "shared memory the driver configured an SM with for the "
                                        "launch (given, or estimated as the driver picks it)"),
        "block_limit": xr.DataArray(table, dims=(dim, "limit"), coords={"limit": list(LIMITERS)},
                                    attrs={"units": "block", "description": "blocks per SM each limit allows"}),
        "blocks_per_sm": row_var(blocks, "block", "blocks resident per SM: the smallest limit"),
        "limited_by": row_var(limiter.astype(str), "", "the limits that set blocks_per_sm, joined by '+'"),
        "theoretical_warps": row_var(warps, "warp", "warps resident per SM, theoretically"),
        "theoretical_occupancy": row_var(occ, "percent", "resident warps of the SM's maximum, theoretically"),
        "achieved_warps": measured(ACHIEVED_WARPS, "warp", "warps resident per SM per active cycle, measured"),
        "achieved_occupancy": measured(ACHIEVED, "percent", "resident warps of the SM's maximum, measured"),
        "sm_active": row_var(sm_active, "percent", "SM cycles active of those elapsed, averaged over SMs"),
        "waves_per_sm": row_var(waves, "wave", "grid blocks over the blocks the GPU holds at once"),
        "tail_blocks": row_var(np.where(np.isfinite(waves), tail, np.nan), "block", "blocks in the last, partial "
                               "wave (0 where the waves are whole)"),
        "tail_share": row_var(tail_share, "ratio", "share of the runtime in the partial wave, if blocks take equal "
                              "time: 1 / ceil(waves)"),
        "tail_utilization": row_var(tail_utilization, "percent", "the partial wave's blocks of a full wave's"),
    })
    out = out.assign_coords({k: c for k, c in ds.coords.items() if c.dims == (dim,)})
    out.attrs = dict(ds.attrs)
    return out
