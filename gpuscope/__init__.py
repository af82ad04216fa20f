"""gpuscope."""
