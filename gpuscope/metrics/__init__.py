"""Pure analysis over gpuscope Datasets: metric sets as data, Top-Down, phases, plots.

Nothing in this package imports CUPTI or CUDA; everything works on any machine.
"""
