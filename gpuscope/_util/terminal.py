"""Text from data made safe to print to a terminal: control characters shown as escapes, never obeyed.

Kernel names, range names and attrs come from the files and programs gpuscope reads; an ESC, OSC, BEL or CR in them,
or a right-to-left override, would move the cursor, retitle the window or reorder what the user reads.
"""

from __future__ import annotations

import re

__all__ = ["printable"]

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides, embeddings, isolates and marks
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """*text* with every control character written as its escape (``\\x1b``, ``\\u202e``); tabs and newlines kept."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))
