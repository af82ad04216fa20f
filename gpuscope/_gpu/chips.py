"""Chip names: the chips the loaded CUPTI profiles, product names for them, and the chip of a device.

Chip names are CUPTI's (``"GH100"`` for the H100); :func:`canonical_chip` reads any case or a product name
(``--chip h100``).
"""

from __future__ import annotations

import difflib
import functools

from gpuscope.errors import NoGpuError, UnsupportedChipError

__all__ = ["CHIP_ALIASES", "list_chips", "canonical_chip"]


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


def canonical_chip(chip: str) -> str:
    """A chip name as CUPTI spells it, from any case or a product name (``"h100"`` -> ``"GH100"``).

    Names that are neither a chip nor a known product come back unchanged (:func:`list_metrics` and friends then
    say which chips exist).
    """
    text = " ".join(chip.strip().lower().replace("geforce", "").replace("nvidia", "").split())
    for c in list_chips():
        if c.lower() == text:
            return c
    return CHIP_ALIASES.get(text, chip)


def _check_chip(chip: str | None, device: int = 0) -> str:
    if chip is None:
        return _device_chip(device)
    chips = list_chips()
    if chip in chips:
        return chip
    hint = ""
    upper = [c for c in chips if c.lower() == chip.lower()]
    if upper:
        hint = f" Chip names are case-sensitive: did you mean {upper[0]!r}?"
    elif chip.strip().lower() in CHIP_ALIASES:
        hint = f" {chip} is a product; its chip is {CHIP_ALIASES[chip.strip().lower()]!r}."
    else:
        close = difflib.get_close_matches(chip.upper(), chips, n=3, cutoff=0.5)
        if close:
            hint = " Closest: " + ", ".join(close) + "."
    raise UnsupportedChipError(f"Chip {chip!r} is not supported by the loaded CUPTI.{hint} Supported: {', '.join(chips)}.")


@functools.lru_cache(maxsize=None)
def _device_chip(device: int) -> str:
    from gpuscope.cupti import profiler

    try:
        from gpuscope._gpu import device as _device

        _device.device_count()
    except NoGpuError as exc:
        raise NoGpuError(f"{exc} Pass chip= (e.g. chip='GH100'); gpuscope metrics --chips lists them.") from None
    profiler.initialize()
    try:
        return profiler.chip_name(device)
    finally:
        profiler.deinitialize()
