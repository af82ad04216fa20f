"""Plain aligned columns on stdout, as ``gpuscope metrics`` and ``gpuscope check`` print their tables."""

from __future__ import annotations

import sys


def _print_table(rows, header=None, out=None):
    out = out or sys.stdout
    rows = [tuple(str(c) for c in r) for r in rows]
    if header:
        rows.insert(0, tuple(header))
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")
