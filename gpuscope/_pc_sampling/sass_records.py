"""SASS-metric records as a Dataset: counts per instruction (cubin, function, PC offset) and its source line.

Used on a :func:`gpuscope.source_counters` block's records when it ends, and on recordings without a GPU. The
same :class:`~gpuscope._pc_sampling.source.SourceMap` as PC sampling maps each PC to its line.
"""

from __future__ import annotations

import numpy as np

__all__ = ["counters_dataset"]


def counters_dataset(records, metrics: dict, source_map, *, launches=None, device_info=None, chip="", attrs=None):
    """Build the source-counters Dataset from flushed records (:class:`gpuscope.cupti.sass_metrics.SassRecords`).

    Parameters
    ----------
    records : SassRecords
        Rows of (cubin CRC, function, PC offset, metric id, value), several per instruction.
    metrics : dict
        Metric id -> (CUPTI name, description), in the order the Dataset lists them. Values of other ids are left
        out and counted in the attr ``values_of_other_metrics``.
    source_map : gpuscope._pc_sampling.source.SourceMap
        Maps PCs to file and line.
    launches : dict, optional
        Mangled kernel name -> launches counted in the block.

    Returns
    -------
    xarray.Dataset
        See :func:`gpuscope._results.source_counters.source_counters_dataset`.
    """
    from gpuscope._pc_sampling.records import pc_coords, source_map_attrs
    from gpuscope._results.source_counters import source_counters_dataset

    column = {int(i): k for k, i in enumerate(metrics)}
    keys: dict[tuple[int, str, int], int] = {}
    rows, cols, vals = [], [], []
    other = 0
    for crc, fn, off, mid, value in zip(records.cubin_crc.tolist(), records.function.tolist(),
                                        records.pc_offset.tolist(), records.metric_id.tolist(),
                                        records.value.tolist()):
        if int(mid) not in column:
            other += 1
            continue
        rows.append(keys.setdefault((int(crc), str(fn), int(off)), len(keys)))
        cols.append(column[int(mid)])
        vals.append(int(value))
    values = np.zeros((len(keys), len(column)), dtype=np.int64)
    np.add.at(values, (np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)),
              np.asarray(vals, dtype=np.int64))
    found = list(keys)
    order = sorted(range(len(found)), key=lambda r: found[r][1:])  # by function, then PC offset
    ordered = [found[r] for r in order]
    values = values[np.asarray(order, dtype=np.int64)]
    pcs = pc_coords(ordered, source_map)
    extra = dict(attrs or {})
    extra["dropped_records"] = int(records.dropped_records)
    extra["values_of_other_metrics"] = other
    extra.update(source_map_attrs(source_map))
    names = [metrics[i][0] for i in metrics]
    descriptions = [metrics[i][1] for i in metrics]
    return source_counters_dataset(pcs, values, names, descriptions, launches, device_info, chip, extra)
