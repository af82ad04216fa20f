"""Colours of the plots: a colour family per Top-Down branch, shades per node; ranges in greys, phases in colour.

The level-2 nodes wear the seven colours of Okabe and Ito's palette, which readers with any of the common colour
vision deficiencies tell apart (retire bluish green, divergence branch orange and replay yellow, frontend fetch sky
blue and decode blue, backend core vermillion and memory reddish purple). A level-1 node takes a darker colour of
its children's family (divergence dark orange, frontend navy, backend raspberry, between its children's vermillion
and purple), so it matches them and is never mistaken for one of them; level-3 nodes take shades of their parent's
colour, spread from darker to lighter. The timeline's range strip is drawn in greys and the phases in a colour
palette, so a range is never read as a phase. matplotlib is imported on first use (:func:`_pyplot`), never at
import time.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope.metrics import topdown as _td

#: Okabe & Ito (2008), "Color Universal Design": level 1 and 2 nodes. A level-1 node's colour is a darker one of
#: its children's family.
_COLORS = {
    "retire": "#009E73",
    "divergence": "#7A5200", "divergence_branch": "#E69F00", "divergence_replay": "#F0E442",
    "frontend": "#00406A", "frontend_fetch": "#56B4E9", "frontend_decode": "#0072B2",
    "backend": "#B0306E", "backend_core": "#D55E00", "backend_memory": "#CC79A7",
}
#: How far level-3 shades reach from their parent's colour: towards black, towards white.
_DARKEST, _LIGHTEST = 0.35, 0.55
_OTHER_COLOR = (0.88, 0.88, 0.85, 1.0)
_PALETTE = "tab10"
#: Phases: a palette of its own, none of whose colours is a grey of the range strip.
_PHASE_PALETTE = "Dark2"
#: The range strip: alternating greys (each range is also named in its stretch of the strip).
_RANGE_GREYS = (0.55, 0.75, 0.65, 0.85)


def _pyplot():
    import matplotlib.pyplot as plt

    return plt


def node_words(name: str) -> str:
    """A Top-Down node (or PC-sampling category) as a reader's words: ``backend_memory`` -> "backend memory",
    ``backend_memory_long_scoreboard`` -> "backend memory: long scoreboard" (the level-2 parent, then the stall)."""
    node = _td._BY_NAME.get(name)
    if node is not None and node.level == 3:
        return f"{node_words(node.parent)}: {name.removeprefix(node.parent + '_').replace('_', ' ')}"
    return name.replace("_", " ")


def _shade(color, t: float) -> tuple:
    """*color* mixed towards black (t < 0) or white (t > 0) by |t|."""
    import matplotlib.colors

    rgb = np.asarray(matplotlib.colors.to_rgb(color))
    mixed = rgb * (1 + t) if t < 0 else rgb + (1 - rgb) * t
    return (*mixed, 1.0)


def _node_colors(names: list[str]) -> dict[str, tuple]:
    """One colour per node: its own (levels 1 and 2), else a shade of its parent's, the members of one parent
    spread from :data:`_DARKEST` to :data:`_LIGHTEST`."""
    colors, children = {}, {}
    for n in names:
        if n in _COLORS:
            colors[n] = _shade(_COLORS[n], 0.0)
        else:
            children.setdefault(_td._BY_NAME[n].parent, []).append(n)
    for parent, members in children.items():
        base = _COLORS.get(parent, _COLORS.get(_td._BY_NAME[parent].parent, "#999999"))
        steps = np.linspace(-_DARKEST, _LIGHTEST, len(members)) if len(members) > 1 else [0.3]
        colors.update({n: _shade(base, float(t)) for n, t in zip(members, steps, strict=True)})
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
