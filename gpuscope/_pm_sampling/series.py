"""Evaluated PM samples and the metric attributes that go with them; offline evaluation of saved images
(host API: works without a GPU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

__all__ = ["Series", "metric_properties", "evaluate_images"]


@dataclasses.dataclass
class Series:
    """Evaluated samples: values (n_metrics x n_samples), timestamps and metric properties."""

    values: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    properties: dict


def metric_properties(chip: str, metrics: Sequence[str], counter_availability=None) -> dict:
    """Per metric: the Dataset attrs ``units``, ``description``, ``metric_type``, ``hw_unit`` (host API, offline)."""
    from gpuscope._gpu import catalog as _catalog
    from gpuscope.cupti import host
    from gpuscope.cupti._types import ProfilerType

    properties = {}
    with host.ProfilerHost(chip, ProfilerType.PM_SAMPLING, counter_availability) as h:
        for name in metrics:
            p = h.metric_properties(name)
            _, suffix = _catalog.split_name(name)
            properties[name] = {
                "units": _catalog.units_of(suffix, p.units),
                "description": p.description,
                "metric_type": p.metric_type.name,
                "hw_unit": p.hw_unit,
            }
    return properties


def evaluate_images(
    chip: str, metrics: Sequence[str], images: Sequence[np.ndarray], timestamps: Sequence[np.ndarray], counter_availability=None
) -> Series:
    """Evaluate decoded PM sampling counter-data images with the host API (works offline).

    *timestamps* holds, per image, an (n, 2) array of each completed sample's start and end (CUPTI ns), as read
    with ``cuptiPmSamplingCounterDataGetSampleInfo`` before the sampling object was disabled.
    """
    from gpuscope.cupti import host
    from gpuscope.cupti._types import ProfilerType

    metrics = list(metrics)
    counts = [len(ts) for ts in timestamps]
    values = np.empty((sum(counts), len(metrics)), dtype=np.float64)
    stamps = np.concatenate([np.asarray(ts, dtype=np.int64).reshape(-1, 2) for ts in timestamps] or [np.empty((0, 2), np.int64)])
    with host.ProfilerHost(chip, ProfilerType.PM_SAMPLING, counter_availability) as h:
        evaluator = h.evaluator(metrics)
        k = 0
        for image, n in zip(images, counts):
            evaluator.evaluate_into(image, 0, n, values[k : k + n])
            k += n
    return Series(
        values=values.T,
        start_ns=stamps[:, 0].copy(),
        end_ns=stamps[:, 1].copy(),
        properties=metric_properties(chip, metrics, counter_availability),
    )
