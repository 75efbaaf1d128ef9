"""The thread governor's median is statistics.median's, odd and even counts alike."""

from __future__ import annotations

import random
import statistics

from localchat.backends.torch.cpu.threads import _median


def test_median_equals_statistics_median() -> None:
    rng = random.Random(0)
    for _ in range(500):
        values = [rng.random() for _ in range(rng.randint(1, 7))]
        assert _median(values) == statistics.median(values)
    assert _median([3.0, 1.0]) == 2.0 and _median([5.0]) == 5.0
