"""The GPU and the process's hold on it: device info, the metric catalog, what a chip supports, what sessions keep."""
