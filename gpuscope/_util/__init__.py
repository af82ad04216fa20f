"""Small helpers every layer may use: argument checks, teardown that Ctrl-C cannot cut short."""
