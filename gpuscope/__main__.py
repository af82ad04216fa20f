"""``python -m gpuscope``: the same as the ``gpuscope`` command."""

import sys

from gpuscope.cli import main

sys.exit(main())
