"""Plots of Top-Down and phase results. matplotlib is imported inside each function, never at import time.

Colours follow the hierarchy, in Okabe and Ito's colour-blind-safe palette: every level-2 node has its own colour
(retire bluish green, divergence orange and yellow, frontend sky blue and blue, backend core vermillion, backend
memory reddish purple), a level-1 node a darker one of its children's family, and level-3 nodes take shades of
their parent's colour spread from darker to lighter, so levels can be compared by colour. The timeline draws
user ranges in greys and phases in a palette of their own, so a range is never read as a phase.

The plots are :mod:`gpuscope.metrics.plot_bars` (Top-Down bars and the hierarchy),
:mod:`gpuscope.metrics.plot_timeline` (metrics over time, Top-Down per phase), :mod:`gpuscope.metrics.plot_roofline`
(the hierarchical roofline) and :mod:`gpuscope.metrics.plot_memory` (the memory chart), their colours
:mod:`gpuscope.metrics.plot_colors`; this module gathers their public names (``ds.gpuscope.plot`` binds them).

Every plot returns its ``matplotlib.figure.Figure``, whether it draws one panel or several and whether it made the
figure or drew into a given ``ax``/``fig``: ``fig.savefig(...)`` saves any of them, ``fig.axes`` holds the panels.
"""

from __future__ import annotations

# NEGLIGIBLE, BAND and MAX_PANELS: the plots' settings, readable here as before (outside __all__, as before)
from gpuscope.metrics.plot_bars import NEGLIGIBLE, hierarchy, topdown  # noqa: F401
from gpuscope.metrics.plot_memory import memory_chart
from gpuscope.metrics.plot_roofline import roofline
from gpuscope.metrics.plot_timeline import BAND, MAX_PANELS, phase_topdown, short_label, timeline  # noqa: F401

__all__ = ["hierarchy", "timeline", "topdown", "phase_topdown", "short_label", "roofline", "memory_chart"]
