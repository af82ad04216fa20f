"""``python -m gpuscope``: the same as the ``gpuscope`` command."""

from gpuscope.cli import entry

entry()
