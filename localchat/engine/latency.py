"""Latency histograms the engine fills as tokens come out: time to first token and inter-token latency.

Cumulative buckets in seconds, the shape Prometheus expects (`le` upper bounds, then +Inf)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

# From a fast GPU (tens of ms) to a long prompt on a laptop CPU (tens of seconds).
TTFT_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    bounds: tuple[float, ...]  # bucket upper bounds; +Inf is implied and equals `count`
    cumulative: tuple[int, ...]  # observations <= each bound
    total: float  # sum of all observations
    count: int


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self._per_bucket = [0] * len(bounds)
        self._total = 0.0
        self._count = 0

    def observe(self, value: float, times: int = 1) -> None:
        index = bisect_left(self.bounds, value)  # first bound >= value: Prometheus' `le`
        if index < len(self._per_bucket):
            self._per_bucket[index] += times
        self._total += value * times
        self._count += times

    def snapshot(self) -> HistogramSnapshot:
        cumulative, running = [], 0
        for n in self._per_bucket:
            running += n
            cumulative.append(running)
        return HistogramSnapshot(self.bounds, tuple(cumulative), self._total, self._count)
