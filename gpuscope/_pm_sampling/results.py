"""What a stopped PM sampler hands back: its Dataset and an account of lost samples (:class:`SamplerResults`).

The part of :class:`~gpuscope._pm_sampling.sampler.Sampler` that reads what sampling left: lost samples counted
from the gaps in the timestamps and explained (decoding too slow, hardware buffer overflows, evaluation behind,
workers lost), and the Dataset built from the evaluated samples, the user ranges and the kernels that ran. The
sampler's options and lifecycle are :mod:`gpuscope._pm_sampling.sampler`'s, whose ``Sampler`` mixes this class in.
"""

from __future__ import annotations

import math

from gpuscope._pm_sampling.plan import suggest_interval_us
from gpuscope._pm_sampling.series import Series, metric_properties
from gpuscope._pm_sampling.timeline import count_lost, innermost_ranges

__all__ = ["SamplerResults"]


class SamplerResults:
    """Lost samples and the Dataset of :class:`~gpuscope._pm_sampling.sampler.Sampler` (a mixin: it uses the
    sampler's state)."""

    # -- lost samples -------------------------------------------------------------------------------------
    def _count_lost(self) -> int:
        starts, ends = self._stamps[:, 0], self._stamps[:, 1]
        if not ends.size:  # nothing arrived: every sample of the session was lost
            return max(0, round((self.stop_ns - self.start_ns) / self.interval_ns))
        return count_lost(starts, ends, self.interval_ns, self.stop_ns)

    @property
    def decode_us_per_sample(self) -> float:
        """Time spent inside ``cuptiPmSamplingDecodeData`` per decoded sample (µs; NaN before any sample)."""
        d = self._decoder
        return d.decode_seconds / d.decoded_samples * 1e6 if d and d.decoded_samples else float("nan")

    def _loss_message(self) -> str:
        """Why samples were lost and what to do, or "" if none were."""
        d = self._decoder
        if not (self.lost_samples or d.overflows or d.errors or d.discarded):
            return ""
        workers = d.evaluation_counts()
        kept = len(self._stamps)
        lines = [
            f"PM sampling on device {self.device} lost {self.lost_samples} of {kept + self.lost_samples} samples "
            f"(interval {self.interval_ns / 1000:g} us, {len(self.metrics)} metrics; "
            "dataset.attrs['lost_samples'])."
        ]
        cost = self.decode_us_per_sample
        if math.isfinite(cost) and cost > 0.7 * self.interval_ns / 1000:
            from gpuscope._gpu.metric_lists import metric_set

            fewer = ("fewer metrics" if set(self.metrics) <= set(metric_set("pm-fast").metrics)
                     else "fewer metrics (the 'pm-fast' set decodes several times faster)")
            threads = (" Evaluation ran in this process (evaluate_in='thread'), where it competes with decoding for "
                       "the interpreter: evaluate_in='process' (the default) lost none at 20 us with pm-fast on an "
                       "H100." if self.evaluate_in == "thread" else "")
            lines.append(
                f"Decoding is the limit: cuptiPmSamplingDecodeData took {cost:.1f} us per sample of these metrics on "
                f"this machine, {100 * cost * 1000 / self.interval_ns:.0f}% of the interval, and it cannot run in "
                f"parallel. Use interval='{suggest_interval_us(cost)}us' or longer, or {fewer}.{threads}"
            )
        if d.overflows:
            lines.append(
                f"The hardware buffer overflowed {d.overflows} time(s): use a longer interval or a larger "
                "hardware_buffer_size."
            )
        if d.discarded:
            lines.append(
                f"{d.discarded} samples were discarded because evaluation fell behind and no counter-data image was "
                "free: use a longer interval, or more image_pool or evaluators."
            )
        if d.images_unevaluated:
            lines.append(
                f"Evaluation stalled: {d.samples_unevaluated} samples in images that no evaluator thread finished "
                f"within {d.EVALUATE_TIMEOUT_S:g} s were not evaluated (attrs 'images_lost'); those threads were left "
                "running."
            )
        if workers["lost"] or workers["images_lost"]:
            lines.append(
                f"{workers['lost']} evaluation worker(s) were lost; {workers['recovered']} image(s) they held "
                f"were evaluated in this process and {workers['images_lost']} could not be (attrs "
                "'evaluation_workers_lost', 'images_recovered', 'images_lost')."
            )
        if d.errors:
            lines.append(f"Errors: {'; '.join(d.errors[:3])}.")
        return " ".join(lines)

    # -- results ------------------------------------------------------------------------------------------
    @property
    def overflows(self) -> int:
        """Hardware-buffer overflows the decode thread saw."""
        return self._decoder.overflows if self._decoder else 0

    @property
    def discarded_samples(self) -> int:
        """Samples decoded while no counter-data image was free (the evaluators fell behind): thrown away."""
        return self._decoder.discarded if self._decoder else 0

    @property
    def dataset(self):
        """The samples as an :class:`xarray.Dataset` (dim ``time``); built on first read.

        Raises
        ------
        RuntimeError
            Sampling has not been stopped yet.
        """
        if self._forked and self._state in ("running", "stopping", "forked"):
            raise RuntimeError(
                f"This sampler was running in process {self._pid} when it forked this one: its samples are that "
                "process's. Sample in this process with a gpuscope.sample(...) of its own."
            )
        if self._state != "stopped":
            raise RuntimeError(
                "No samples yet: read .dataset after the `with gpuscope.sample(...)` block (or after .stop())."
            )
        if self._dataset is None:
            self._dataset = self._build()
        return self._dataset

    def report(self, **options):
        """The readable summary of :attr:`dataset`: per user range (``by="phase"``: per phase); see
        :func:`gpuscope.report`."""
        from gpuscope._results.report import report

        return report(self.dataset, **options)

    def _executions(self):
        """The kernels that ran on this device while sampling (``kernels=True``), or None."""
        records = self._kernel_records
        if records is None:
            return None
        mine = [r for r in records.records if r[3] == self.device]  # CUPTI's deviceId: the CUDA device ordinal
        return {"records": mine, "dropped": records.dropped, "errors": records.errors,
                "other_devices": len(records.records) - len(mine)}

    def _build(self):
        from gpuscope._results import build as _results

        values, stamps = self._values, self._stamps
        workers = self._decoder.evaluation_counts()
        series = Series(
            values=values.T,
            start_ns=stamps[:, 0].copy(),
            end_ns=stamps[:, 1].copy(),
            properties=metric_properties(self.chip, self.metrics, self.availability),
        )
        spans = self._recorder.spans(self.stop_ns)
        mid = (series.start_ns + series.end_ns) // 2
        return _results.sampling_dataset(
            values=series.values,
            metrics=self.metrics,
            properties=series.properties,
            start_ns=series.start_ns,
            end_ns=series.end_ns,
            ranges=innermost_ranges(mid, spans),
            spans=spans,
            executions=self._executions(),
            session_start_ns=self.start_ns,
            device_info=self.device_info,
            chip=self.chip,
            attrs={
                "wall_clock_ns": int(self.wall_clock_ns),
                "interval_ns": int(self.interval_ns),
                "trigger": self.trigger.value,
                "hardware_interval": int(self._hw_interval),
                "hardware_buffer_size": self.hardware_buffer_size,
                "sampler_reused": int(getattr(self, "reused", False)),
                "session_end_ns": int(self.stop_ns),
                "lost_samples": int(self.lost_samples),
                "overflows": int(self.overflows),
                "decode_errors": "; ".join(self._decoder.errors[:10]),
                "counter_data_images": int(self._decoder.handed_off),
                "counter_data_pool": int(self.image_pool),
                "samples_per_image": int(self._decoder.samples_per_image),
                "discarded_samples": int(self.discarded_samples),
                "full_decodes": int(self._decoder.full_stops),
                "evaluate_in": self.evaluate_in,
                "evaluators": int(self.evaluators),
                "evaluation_workers_ready": int(workers["ready"]),
                "evaluation_workers_lost": int(workers["lost"]),
                "images_recovered": int(workers["recovered"]),
                "images_lost": int(self._decoder.images_lost),
                "pool_note": self._decoder.pool_note,
                **self._set_attrs,
                "inexact_batches": int(self._decoder.inexact_batches),
                "decode_us_per_sample": float(round(self.decode_us_per_sample, 3)),
                "decode_seconds": float(round(self._decoder.decode_seconds, 6)),
                "stop_call_ns": int(self.stop_call_ns),
            },
        )
