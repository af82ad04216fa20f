"""Colours of the plots: a colour family per Top-Down branch, shades per node, one palette for ranges and phases.

Every level-2 node has its own colour family (retire green, divergence orange, frontend fetch blue, decode grey,
backend core red, backend memory purple) and level-3 nodes take shades of their parent's family spread as far
apart as the family allows, so levels can be compared by colour. Ranges and phases share one palette: a phase
that lies mostly in one user range takes that range's colour. matplotlib is imported on first use (:func:`_pyplot`),
never at import time.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope._schema.labels import string_labels
from gpuscope.metrics import topdown as _td

_FAMILY = {
    "retire": "Greens", "divergence": "Oranges", "divergence_branch": "Oranges", "divergence_replay": "YlOrBr_light",
    "frontend": "Blues", "frontend_fetch": "Blues", "frontend_decode": "Greys",
    "backend": "Reds", "backend_core": "Reds", "backend_memory": "Purples",
}
_OTHER_COLOR = (0.88, 0.88, 0.85, 1.0)
_PALETTE = "tab10"


def _pyplot():
    import matplotlib.pyplot as plt

    return plt


def _family(name: str) -> str:
    """The colour family of a node: its own, else its level-2 ancestor's, else its level-1 ancestor's."""
    node = _td._BY_NAME[name]
    while node.name not in _FAMILY:
        node = _td._BY_NAME[node.parent]
    return node.name


def _node_colors(names: list[str]) -> dict[str, tuple]:
    """One colour per node: shades of its family's colour map, spread over [0.35, 0.85] among the members."""
    import matplotlib

    colors, groups = {}, {}
    for n in names:
        groups.setdefault(_family(n), []).append(n)
    for family, members in groups.items():
        name = _FAMILY[family]
        cmap = matplotlib.colormaps[name.removesuffix("_light")]
        top = 0.35 if name.endswith("_light") else 0.85  # a light family stays apart from its dark sibling
        for i, n in enumerate(members):
            colors[n] = cmap(top - 0.5 * i / (len(members) - 1) if len(members) > 1 else top - 0.2)
    return colors


def _label_colors(labels) -> dict:
    """Colour per label (range path or phase), in order of first appearance, "" (no range) left white."""
    plt = _pyplot()
    cmap = plt.get_cmap(_PALETTE)
    seen = [v for v in dict.fromkeys(labels) if v != ""]
    return {v: cmap(i % cmap.N) for i, v in enumerate(seen)}


def _phase_colors(ds: xr.Dataset, dim: str, range_colors: dict) -> dict:
    """Colour per phase: the colour of the user range holding most of its samples, when no larger phase took
    it; otherwise the next palette colour no range uses."""
    plt = _pyplot()
    cmap = plt.get_cmap(_PALETTE)
    phase = np.asarray(ds["phase"])
    ranges = string_labels(ds["range"]) if "range" in ds.coords and ds["range"].dims == (dim,) else None
    ids = [int(p) for p in np.asarray(ds["phase_id"])]
    sizes = {p: int(np.sum(phase == p)) for p in ids}
    colors, taken = {}, set()
    for p in sorted(ids, key=lambda p: -sizes[p]):
        if ranges is not None and sizes[p]:
            names, counts = np.unique(ranges[phase == p], return_counts=True)
            best = names[np.argmax(counts)]
            if best in range_colors and counts.max() > sizes[p] / 2 and best not in taken:
                colors[p] = range_colors[best]
                taken.add(best)
    free = (cmap(i % cmap.N) for i in range(len(range_colors), len(range_colors) + len(ids)))
    for p in ids:
        colors.setdefault(p, next(free))
    return colors
