"""The thread governor's per-step shortcuts (backends/torch/cpu/threads.py): OtherLoad reads /proc/stat
only once a window is over, with the values reading every call gave; a step of the last step's size
reuses its kind; decisions equal a governor without the shortcuts."""

from __future__ import annotations

import pytest

from localchat.backends.torch.cpu import threads
from localchat.backends.torch.cpu.threads import LOAD_WINDOW_S, OtherLoad, ThreadGovernor


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.reads = 0

    def monotonic(self) -> float:
        return self.now

    def sample(self) -> tuple[float, float, float]:
        """A machine whose other processes keep 0.75 cores busy, we 1.0."""
        self.reads += 1
        return self.now, 1.75 * self.now, 1.0 * self.now


def test_other_load_reads_once_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(threads, "_cpu_sample", clock.sample)
    monkeypatch.setattr(threads.time, "monotonic", clock.monotonic)
    load = OtherLoad()
    values = []
    for _ in range(40):  # 5 windows, 8 calls each (exact binary fractions of a second)
        clock.now += LOAD_WINDOW_S / 8
        values.append(load())
    # Every call used to read; the value changes only when a window ends (here at each 8th call).
    assert clock.reads == 1 + 5
    assert values[:7] == [float("inf")] * 7
    assert values[7:] == pytest.approx([0.75] * 33)


def test_a_failed_first_read_still_answers_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_cpu_sample", lambda: None)
    assert OtherLoad()() is None


def _drive(gov: ThreadGovernor, sizes: list[int]) -> list[int]:
    used = []
    for i, tokens in enumerate(sizes):
        count = gov.threads_for(tokens)
        # all cores faster for small steps on even i, slower on odd: trials and switches happen
        seconds = 0.010 * tokens.bit_length() * (0.8 if (count == 2) == (i % 97 < 50) else 1.0)
        gov.record(tokens, count, seconds)
        used.append(count)
    return used


def test_the_kind_shortcut_decides_as_before() -> None:
    sizes = [1] * 300 + [5, 6, 7] * 40 + [1] * 100 + [1, 300] * 60 + [2, 3] * 50
    cached = ThreadGovernor((1, 2), other_load=lambda: 0.0)
    plain = ThreadGovernor((1, 2), other_load=lambda: 0.0)
    lookup = ThreadGovernor._kind

    def uncached(self: ThreadGovernor, num_tokens: int) -> threads._Kind:
        self._last = (-1, self._last[1])  # never the last size: the dict lookup every time
        return lookup(self, num_tokens)

    plain._kind = uncached.__get__(plain)  # type: ignore[method-assign]
    assert _drive(cached, sizes) == _drive(plain, sizes)
    assert cached._kinds.keys() == plain._kinds.keys() == {1, 2, 3, 9}
