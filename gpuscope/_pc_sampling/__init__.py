"""PC sampling (where warps stall, per source line), SASS source counters (exact instruction counts per line),
the source view joining the two, and the fast Top-Down built on PC sampling."""
