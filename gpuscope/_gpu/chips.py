"""Chip names: the chips the loaded CUPTI profiles, product names for them, and the chip of a device.

Chip names are CUPTI's (``"GH100"`` for the H100); :func:`resolve_chip`, the one resolver of ``chip=`` and
``--chip``, reads any case or a product name (``h100``) and names the closest matches of an unknown one.
"""

from __future__ import annotations

import difflib
import functools

from gpuscope.errors import NoGpuError, UnsupportedChipError

__all__ = ["CHIP_ALIASES", "list_chips", "canonical_chip", "resolve_chip"]


def list_chips() -> list[str]:
    """Chip names the loaded CUPTI can profile (e.g. ``"GH100"`` for the H100)."""
    from gpuscope.cupti import host

    return host.supported_chips()


#: Product names (lower case) -> CUPTI chip name, for the command line (``--chip h100``).
CHIP_ALIASES = {
    "h100": "GH100", "h200": "GH100", "h800": "GH100", "gh200": "GH100", "h20": "GH100",
    "a100": "GA100", "a800": "GA100", "a30": "GA100",
    "a10": "GA102", "a40": "GA102", "a6000": "GA102", "rtx a6000": "GA102", "rtx 3090": "GA102", "rtx 3080": "GA102",
    "a16": "GA107", "a2": "GA107", "rtx 3070": "GA104", "rtx 3060": "GA106",
    "l40": "AD102", "l40s": "AD102", "l20": "AD102", "rtx 4090": "AD102", "rtx 6000 ada": "AD102",
    "rtx 4080": "AD103", "l4": "AD104", "rtx 4070": "AD104", "rtx 4060": "AD107",
    "t4": "TU104", "rtx 2080": "TU104", "rtx 2080 ti": "TU102", "titan rtx": "TU102", "rtx 8000": "TU102",
    "b200": "GB100", "b100": "GB100", "gb200": "GB100",
    "b300": "GB110", "gb300": "GB110",
    "rtx 5090": "GB202", "rtx pro 6000": "GB202", "rtx 5080": "GB203", "rtx 5070": "GB205",
}


def _plain(chip: str) -> str:
    """A chip or product name in lower case, without "NVIDIA", "GeForce" and repeated spaces."""
    return " ".join(chip.strip().lower().replace("geforce", "").replace("nvidia", "").split())


def canonical_chip(chip: str) -> str:
    """A chip name as CUPTI spells it, from any case or a product name (``"h100"`` -> ``"GH100"``).

    Names that are neither a chip nor a known product come back unchanged (:func:`resolve_chip` refuses them).
    """
    text = _plain(chip)
    for c in list_chips():
        if c.lower() == text:
            return c
    return CHIP_ALIASES.get(text, chip)


def resolve_chip(chip: str | None, device: int = 0) -> str:
    """The CUPTI chip name for *chip*, the one resolver of the API (``chip=``) and the command line (``--chip``).

    Parameters
    ----------
    chip : str or None
        A CUPTI chip name or a product name, in any case (``"GH100"``, ``"gh100"``, ``"h100"``,
        ``"GeForce RTX 4090"``); None: the chip of GPU *device* (initialises CUPTI's profiler on it).
    device : int
        The GPU whose chip None stands for.

    Raises
    ------
    UnsupportedChipError
        The loaded CUPTI cannot profile the chip; the message names the closest chips and products.
    NoGpuError
        *chip* is None and there is no GPU.
    """
    if chip is None:
        return _device_chip(device)
    chips = list_chips()
    name = canonical_chip(chip)
    if name in chips:
        return name
    text = _plain(chip)
    if text in CHIP_ALIASES:
        hint = f" {chip} is a product; its chip {CHIP_ALIASES[text]} is not among them."
    else:
        lowered = {c.lower(): c for c in chips}
        close = difflib.get_close_matches(text, [*lowered, *CHIP_ALIASES], n=3, cutoff=0.5)
        named = [lowered[c] if c in lowered else f"{c} ({CHIP_ALIASES[c]})" for c in close]
        hint = " Closest: " + ", ".join(named) + "." if named else ""
    raise UnsupportedChipError(f"Chip {chip!r} is not supported by the loaded CUPTI.{hint} Supported: "
                               f"{', '.join(chips)} (or a product name: h100, rtx 4090, ...).")


@functools.lru_cache(maxsize=None)
def _device_chip(device: int) -> str:
    from gpuscope.cupti import profiler

    try:
        from gpuscope._gpu import device as _device

        _device.device_count()
    except NoGpuError as exc:
        raise NoGpuError(f"{exc} Name a chip (chip= in Python, --chip on the command line): GH100, or a product "
                         "such as h100; gpuscope metrics --chips lists them.") from None
    profiler.initialize()
    try:
        return profiler.chip_name(device)
    finally:
        profiler.deinitialize()
