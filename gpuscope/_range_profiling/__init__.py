"""Range profiling (CUPTI Range Profiler): sessions, user ranges, the kernel/iteration/auto modes, launches, filters."""
