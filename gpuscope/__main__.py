"""``python -m gpuscope``: the same as the ``gpuscope`` command."""

import sys

from .cli import main

sys.exit(main())
