"""PC sampling (where warps stall, per source line) and the fast Top-Down built on it."""
