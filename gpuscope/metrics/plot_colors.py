"""Colours of the plots: a colour family per Top-Down branch, shades per node; ranges in greys, phases in colour.

Every level-2 node has its own colour family (retire green, divergence orange, frontend fetch blue, decode grey,
backend core red, backend memory purple) and level-3 nodes take shades of their parent's family spread as far
apart as the family allows, so levels can be compared by colour. A level-1 node that has children takes a colour
none of them has (backend magenta, frontend navy, divergence dark brown): ``backend`` is core *and* memory, so it
must not wear ``backend_core``'s red. The timeline's range strip is drawn in greys and the phases in a colour
palette, so a range is never read as a phase. matplotlib is imported on first use (:func:`_pyplot`), never at
import time.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope.metrics import topdown as _td

_FAMILY = {
    "retire": "Greens", "divergence": "Oranges", "divergence_branch": "Oranges", "divergence_replay": "YlOrBr_light",
    "frontend": "Blues", "frontend_fetch": "Blues", "frontend_decode": "Greys",
    "backend": "Reds", "backend_core": "Reds", "backend_memory": "Purples",
}
#: Level-1 nodes with children: (colour map, position) of a colour no child of theirs takes.
_PARENT = {"backend": ("RdPu", 0.75), "frontend": ("Blues", 0.95), "divergence": ("Oranges", 0.95)}
_OTHER_COLOR = (0.88, 0.88, 0.85, 1.0)
_PALETTE = "tab10"
#: Phases: a palette of its own, none of whose colours is a grey of the range strip.
_PHASE_PALETTE = "Dark2"
#: The range strip: alternating greys (each range is also named in its stretch of the strip).
_RANGE_GREYS = (0.55, 0.75, 0.65, 0.85)


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
        if family in _PARENT and members == [family]:
            colors[family] = matplotlib.colormaps[_PARENT[family][0]](_PARENT[family][1])
            continue
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


def _range_colors(labels) -> dict:
    """Grey per range label (range path), in order of first appearance, "" (no range) left white: the strip's
    text names each range, and greys keep the strip apart from the phases' colours."""
    seen = [v for v in dict.fromkeys(labels) if v != ""]
    return {v: (g, g, g, 1.0) for v, g in zip(seen, (_RANGE_GREYS[i % len(_RANGE_GREYS)] for i in range(len(seen))),
                                              strict=True)}


def _phase_colors(ds: xr.Dataset) -> dict:
    """Colour per phase id, in id order, from the phase palette (never a colour of the range strip)."""
    cmap = _pyplot().get_cmap(_PHASE_PALETTE)
    return {int(p): cmap(i % cmap.N) for i, p in enumerate(np.asarray(ds["phase_id"]))}
