"""How many CPU threads each step runs on, when the user left it to us: all cores, or all but one,
whichever has been running this kind of step faster lately.

NOTE: no fixed count is right. Measured on the 2-core dev box (SmolLM2-135M, single-stream decode):
idle, two threads run 72 tok/s and one 50; with one busy process beside us, two threads collapse to 12
tok/s (every matmul ends in a barrier that waits out the other core's scheduler slice) while one keeps
40-46; behind the HTTP server (which needs CPU to stream), one thread gives 42 tok/s and two 32; a
16-request batch and prefill gain from two. So each kind of step (bucketed by its token count) keeps
the count that won, and now and then re-tries the other for a few steps: rarely while the winner keeps
winning (the interval doubles), soon after it changes. A trial ends at its first step that is clearly
slower, and trials may take at most `PROBE_BUDGET` of all step time: under the collapse above one
trial step costs as much as 30 ordinary ones.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

PROBE_STEPS = 3  # steps timed per trial of the other count (their median decides)
MIN_INTERVAL = 16  # steps between trials, right after a switch
MAX_INTERVAL = 1024
MARGIN = 0.9  # the other count must be >= 10% faster to take over
GIVE_UP = 1.5  # a trial step this much slower than the current count's median ends the trial
PROBE_BUDGET = 0.03  # of all step seconds, spent on trial steps at most


@dataclass(slots=True)
class _Kind:
    """One kind of step: which count runs it and how the counts fared."""

    current: int
    times: dict[int, deque[float]] = field(default_factory=dict)  # threads -> recent step seconds
    interval: int = MIN_INTERVAL
    countdown: int = PROBE_STEPS  # steps until the next trial (the first comes early)
    probing: int = 0  # trial steps left


class ThreadGovernor:
    def __init__(self, choices: tuple[int, int]) -> None:
        """`choices`: (the safe count, the other); every kind of step starts on the safe one."""
        self.choices = choices
        self._kinds: dict[int, _Kind] = {}
        self._seconds = 0.0  # all recorded steps
        self._probe_seconds = 0.0  # trial steps

    def threads_for(self, num_tokens: int) -> int:
        """The count to run a step of `num_tokens` tokens with; report its time to `record`."""
        kind = self._kind(num_tokens)
        return self._other(kind.current) if kind.probing else kind.current

    def record(self, num_tokens: int, threads: int, seconds: float) -> None:
        kind = self._kind(num_tokens)
        self._seconds += seconds
        if kind.probing:
            self._probe_seconds += seconds
            self._trial_step(kind, threads, seconds)
            return
        recent = kind.times.setdefault(threads, deque(maxlen=PROBE_STEPS))
        # On all cores, a neighbour turning busy makes every step many times slower: try the safe
        # count at once rather than at the next scheduled trial.
        alarm = threads != self.choices[0] and len(recent) == PROBE_STEPS
        alarm = alarm and seconds > GIVE_UP * statistics.median(recent)
        recent.append(seconds)
        kind.countdown -= 1
        if alarm or (kind.countdown <= 0 and len(recent) == PROBE_STEPS and self._may_try(kind)):
            kind.probing = PROBE_STEPS
            kind.times.pop(self._other(kind.current), None)  # judge the other on fresh steps only

    def _may_try(self, kind: _Kind) -> bool:
        # Trying the safe count costs little; trying all cores may cost a lot, so it has a budget.
        risky = kind.current == self.choices[0]
        return not risky or self._probe_seconds <= PROBE_BUDGET * self._seconds

    def _trial_step(self, kind: _Kind, threads: int, seconds: float) -> None:
        kind.probing -= 1
        if seconds > GIVE_UP * statistics.median(kind.times[kind.current]):
            kind.probing = 0  # clearly slower: no need for more steps
            self._keep(kind)
            return
        kind.times.setdefault(threads, deque(maxlen=PROBE_STEPS)).append(seconds)
        if not kind.probing:
            self._decide(kind)

    def _decide(self, kind: _Kind) -> None:
        other = self._other(kind.current)
        ours, theirs = (statistics.median(kind.times[t]) for t in (kind.current, other))
        if theirs < ours * MARGIN:
            kind.current, kind.interval = other, MIN_INTERVAL
            kind.countdown = kind.interval
        else:
            self._keep(kind)

    def _keep(self, kind: _Kind) -> None:
        kind.interval = min(2 * kind.interval, MAX_INTERVAL)
        kind.countdown = kind.interval

    def _kind(self, num_tokens: int) -> _Kind:
        key = min(num_tokens.bit_length(), 10)  # 1, 2-3, 4-7, ... 512+ tokens
        kind = self._kinds.get(key)
        if kind is None:
            kind = self._kinds[key] = _Kind(self.choices[0])
        return kind

    def _other(self, threads: int) -> int:
        return self.choices[1] if threads == self.choices[0] else self.choices[0]
