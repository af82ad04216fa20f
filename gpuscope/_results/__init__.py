"""From collected data to the user's answer: Dataset builders, netCDF files, reports, comparisons, traces, ranks."""
