"""The Dataset schema: dims, coords, attrs and tables of every gpuscope Dataset, kernel names, labels.

The only place that knows how a Dataset is laid out; analysis (:mod:`gpuscope.metrics`) reads Datasets through it."""
