"""What a paper's reader checks in a figure, as code (issue 37, item 11): :func:`problems` lists what is wrong.

* Every text drawn is at least ``MIN_POINTS`` (8 pt) at the figure's printed size: its own size, or a page's text
  width (``PRINT_WIDTH``, 7 in) where it is wider, which shrinks every text by the same factor.
* Every text lies inside the figure (nothing cut off at its edge), no two texts overlap, and a text in a plot lies
  inside a box (bar, span, diagram box) or outside it, never across its edge.
* Every legend entry stands for something drawn: a patch or band of its colour at least a pixel wide and high, a
  line of its colour and dash pattern, a marker of its shape. An entry without a visible handle (a white box, as
  the hierarchy's "n nodes not listed") is text and is not checked.

Colours are compared as they appear on white paper (alpha blended), so a legend swatch must look like what it
stands for.
"""

from __future__ import annotations

import itertools

import matplotlib
import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text

PRINT_WIDTH = 7.0
MIN_POINTS = 8.0
_COLOUR_TOLERANCE = 0.06  # per channel, 0..1, on white


def drawn_texts(fig) -> list[tuple[Text, object]]:
    """(text, its window extent) of every text a draw of *fig* really draws (visible, not empty, in its axes)."""
    seen = []
    original = Text.draw

    def draw(self, renderer):
        original(self, renderer)
        if self.get_visible() and self.get_text().strip():
            seen.append((self, self.get_window_extent(renderer)))

    Text.draw = draw
    try:
        fig.canvas.draw()
    finally:
        Text.draw = original
    return seen


def _corners(text, box) -> np.ndarray:
    """The four corners, in pixels, of the box *text* covers: its window extent turned back by its rotation (the
    extent of a rotated text is the upright box around it, which would make slanted tick labels seem to touch)."""
    angle = np.radians(text.get_rotation())
    cos, sin = abs(np.cos(angle)), abs(np.sin(angle))
    # solve the upright box's size for the text's own width and height
    det = cos * cos - sin * sin
    if abs(det) < 1e-6:  # at 45 degrees the upright box says only w + h; take the line height from the font
        h = text.get_fontsize() * text.figure.dpi / 72
        w = box.width / cos - h
    else:
        w, h = (box.width * cos - box.height * sin) / det, (box.height * cos - box.width * sin) / det
    unit = np.array([[np.cos(angle), np.sin(angle)], [-np.sin(angle), np.cos(angle)]])
    half = np.array([[-w, -h], [w, -h], [w, h], [-w, h]]) / 2 - np.sign([[-w, -h], [w, -h], [w, h], [-w, h]])
    return np.array([box.x0 + box.width / 2, box.y0 + box.height / 2]) + half @ unit


def _apart(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two convex polygons are apart: some edge's normal separates their projections."""
    for poly in (a, b):
        for p, q in zip(poly, np.roll(poly, -1, axis=0), strict=True):
            normal = np.array([q[1] - p[1], p[0] - q[0]])
            pa, pb = a @ normal, b @ normal
            if pa.max() <= pb.min() or pb.max() <= pa.min():
                return True
    return False


def _on_white(color, alpha=None) -> np.ndarray:
    rgba = np.array(matplotlib.colors.to_rgba(color, alpha))
    return rgba[:3] * rgba[3] + (1 - rgba[3])


def _same(a, b) -> bool:
    return bool(np.all(np.abs(a - b) <= _COLOUR_TOLERANCE))


def _pixels(artist, ax) -> tuple[float, float]:
    """Width and height, in pixels, of what *artist* covers on screen."""
    if isinstance(artist, PolyCollection):
        points = [ax.transData.transform(p.vertices) for p in artist.get_paths() if len(p.vertices)]
        if not points:
            return 0.0, 0.0
        # a band is as visible as its tallest column: the largest extent of any of its polygons
        return max(float(np.ptp(p[:, 0])) for p in points), max(float(np.ptp(p[:, 1])) for p in points)
    box = artist.get_window_extent()
    return float(box.width), float(box.height)


def _areas(fig):
    """(colour on white, artist, axes) of every filled patch and band drawn in the figure's axes."""
    for ax in fig.axes:
        for patch in ax.patches:
            if patch.get_visible() and patch.get_fill():
                yield _on_white(patch.get_facecolor()), patch, ax
        for coll in ax.collections:
            if isinstance(coll, PolyCollection) and coll.get_visible() and len(coll.get_facecolor()):
                yield _on_white(coll.get_facecolor()[0]), coll, ax


def _lines(fig):
    for ax in fig.axes:
        for line in ax.lines:
            x, y = (np.asarray(v, dtype=float) for v in line.get_data())
            if line.get_visible() and np.isfinite(x * y).any():
                yield line


def _no_style(value) -> bool:
    return value in (None, "", "None", "none", " ")


def _legend_problems(fig, legend: Legend) -> list[str]:
    out = []
    for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
        label = text.get_text()
        if isinstance(handle, Patch):
            colour = _on_white(handle.get_facecolor())
            if _same(colour, np.ones(3)):
                continue  # a text-only entry
            if not any(_same(colour, c) and min(_pixels(a, ax)) >= 1 for c, a, ax in _areas(fig)):
                out.append(f"legend entry {label!r}: no patch of its colour is visible")
        elif isinstance(handle, Line2D):
            colour = _on_white(handle.get_color(), handle.get_alpha())
            lines = list(_lines(fig))
            if not _no_style(handle.get_linestyle()) and not any(
                    _same(colour, _on_white(ln.get_color(), ln.get_alpha()))
                    and ln.get_linestyle() == handle.get_linestyle() for ln in lines):
                out.append(f"legend entry {label!r}: no line of its colour and dashes is drawn")
            if not _no_style(handle.get_marker()):
                if not any(ln.get_marker() == handle.get_marker() for ln in lines):
                    out.append(f"legend entry {label!r}: no marker of its shape is drawn")
                if _no_style(handle.get_linestyle()) and not any(
                        _same(colour, _on_white(ln.get_color(), ln.get_alpha())) and not _no_style(ln.get_marker())
                        for ln in lines):
                    out.append(f"legend entry {label!r}: no marker of its colour is drawn")
    return out


def problems(fig) -> list[str]:
    """What a reader would complain about in *fig*, one line each (empty: nothing)."""
    texts = drawn_texts(fig)
    scale = min(1.0, PRINT_WIDTH / fig.get_figwidth())
    frame = fig.bbox
    out = []
    for text, box in texts:
        printed = text.get_fontsize() * scale
        if printed < MIN_POINTS - 1e-6:
            out.append(f"{text.get_text()[:40]!r}: {printed:.1f} pt when printed {fig.get_figwidth() * scale:.1f} in "
                       f"wide")
        if box.x0 < frame.x0 - 1 or box.y0 < frame.y0 - 1 or box.x1 > frame.x1 + 1 or box.y1 > frame.y1 + 1:
            out.append(f"{text.get_text()[:40]!r}: outside the figure")
    shapes = [(text, _corners(text, box)) for text, box in texts]
    for (a, poly_a), (b, poly_b) in itertools.combinations(shapes, 2):
        if not _apart(poly_a, poly_b):
            out.append(f"{a.get_text()[:30]!r} overlaps {b.get_text()[:30]!r}")
    for ax in fig.axes:
        boxes = [p.get_window_extent() for p in ax.patches if p.get_visible() and p.get_fill()]
        for text, poly in shapes:
            if text.axes is not ax or text not in ax.texts:
                continue
            for box in boxes:
                inside = np.all((poly >= [box.x0 - 1, box.y0 - 1]) & (poly <= [box.x1 + 1, box.y1 + 1]))
                if not inside and not _apart(poly, np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1],
                                                             [box.x0, box.y1]])):
                    out.append(f"{text.get_text()[:30]!r} runs across the edge of a box")
                    break
    for legend in {id(lg): lg for lg in fig.findobj(Legend)}.values():
        out += _legend_problems(fig, legend)
    return out
