"""What the ``gpuscope`` command runs beyond the library calls: ``gpuscope run`` and ``gpuscope demo``."""
