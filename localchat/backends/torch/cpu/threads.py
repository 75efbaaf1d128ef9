"""How many CPU threads each step runs on, when the user left it to us: all cores, or all but one,
whichever has been running this kind of step faster lately.

NOTE: no fixed count is right. Measured on the 2-core dev box (SmolLM2-135M, single-stream decode):
idle, two threads run 72 tok/s and one 50; with one busy process beside us, two threads collapse to 12
tok/s (every matmul ends in a barrier that waits out the other core's scheduler slice) while one keeps
40-46; behind the HTTP server (which needs CPU to stream), one thread gives 42 tok/s and two 32; a
16-request batch and prefill gain from two. So each kind of step (bucketed by its token count) keeps
the count that won, and now and then re-tries the other for a few steps: rarely while the winner keeps
winning (the interval doubles), soon after it changes. Trying all cores is risky (under the collapse
one step took 1.2 s instead of 25 ms), so it is only tried while other processes leave the machine
idle, niced processes aside (Linux: /proc/stat), within `PROBE_BUDGET` of all step time, and a trial ends at its first
clearly slower step. On all cores, two steps in a row that take far longer bring the safe count back.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

PROBE_STEPS = 3  # steps timed per trial of the other count (their median decides)
MIN_INTERVAL = 16  # steps between trials, right after a switch
MAX_INTERVAL = 1024
MARGIN = 0.9  # the other count must be >= 10% faster to take over
GIVE_UP = 1.5  # a trial step this much slower than the current count's median ends the trial
PROBE_BUDGET = 0.03  # of all step seconds, lost to trial steps at most
IDLE_CORES = 0.25  # other processes busier than this (in cores) rule out trying all cores
LOAD_WINDOW_S = 0.5  # shortest span over which the other processes' load is measured


class OtherLoad:
    """Cores kept busy by other processes over the last `LOAD_WINDOW_S`+ (Linux); inf until the first
    window is over; None where the OS does not tell."""

    def __init__(self) -> None:
        self._last = _cpu_sample()
        self._value = math.inf

    def __call__(self) -> float | None:
        if self._last is not None and time.monotonic() - self._last[0] < LOAD_WINDOW_S:
            # The value changes only once a window is over: until then it is the last one, without the
            # /proc/stat read (a step on the safe count asks every step while all cores are untried).
            return self._value
        now = _cpu_sample()
        if now is None or self._last is None:
            return None
        (t0, busy0, ours0), (t1, busy1, ours1) = self._last, now
        if t1 - t0 >= LOAD_WINDOW_S:
            self._value = max(0.0, (busy1 - busy0 - (ours1 - ours0)) / (t1 - t0))
            self._last = now
        return self._value


def _cpu_sample() -> tuple[float, float, float] | None:
    """(monotonic s, CPU seconds the processes that compete with us were busy, CPU seconds of this process)."""
    try:
        with open("/proc/stat") as f:
            line = f.readline()
        busy = busy_ticks(line, os.getpriority(os.PRIO_PROCESS, 0))
    except (OSError, ValueError):
        return None
    times = os.times()
    return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), times.user + times.system


def busy_ticks(cpu_line: str, our_nice: int) -> int:
    """Busy ticks in /proc/stat's first line (`cpu user nice system idle iowait irq softirq steal`) that
    count against all cores: all but idle and iowait, and, while we run at nice <= 0, but the niced
    processes' ticks too. The scheduler gives a nice-19 neighbour ~1.5% of a core we want, so it cannot
    collapse two-thread decode (real Qwen2.5-Coder-1.5B, 2 threads, 2 cores: 38-41 tok/s beside a nice-19
    busy loop, 40-42 alone, 14-17 beside a nice-0 one); counting it kept a server on one thread (33 tok/s)
    whenever anyone ran niced tests on the box. A niced server competes with niced neighbours: all count."""
    ticks = [int(v) for v in cpu_line.split()[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy - ticks[1] if our_nice <= 0 else busy


@dataclass(slots=True)
class _Kind:
    """One kind of step: which count runs it and how the counts fared."""

    current: int
    times: dict[int, deque[float]] = field(default_factory=dict)  # threads -> recent step seconds
    interval: int = MIN_INTERVAL
    countdown: int = PROBE_STEPS  # steps until the next trial (the first comes early)
    probing: int = 0  # trial steps left
    slow_steps: int = 0  # steps in a row on all cores far slower than the ones before them


class ThreadGovernor:
    def __init__(
        self, choices: tuple[int, int], other_load: Callable[[], float | None] | None = None
    ) -> None:
        """`choices`: (the safe count, all cores).
        `other_load`: cores used by other processes lately, None if unknowable (default: `OtherLoad`)."""
        self.choices = choices
        self._other_load = other_load or OtherLoad()
        self._kinds: dict[int, _Kind] = {}
        self._seconds = 0.0  # all recorded steps
        self._probe_seconds = 0.0  # trial steps
        self._last = (-1, _Kind(0))  # the last step's token count and its kind (none yet: no count is -1)

    def threads_for(self, num_tokens: int) -> int:
        """The count to run a step of `num_tokens` tokens with; report its time to `record`."""
        kind = self._kind(num_tokens)
        if kind.probing:
            return self._other(kind.current)
        if kind.current == self.choices[0] and self.choices[1] not in kind.times and self._idle():
            # Started on the safe count because the box was busy then (a server's first request can
            # come while another process loads): an idle box moves it to all cores now, as a new kind
            # would. Rare kinds (a server's prefill of a cached prompt's last block: one step a request)
            # would otherwise wait many requests for a trial: 125 ms a step on one thread, 80 on two.
            kind.current = self.choices[1]
        return kind.current

    def record(self, num_tokens: int, threads: int, seconds: float) -> None:
        kind = self._kind(num_tokens)
        self._seconds += seconds
        if kind.probing:
            # What a trial costs is the time it loses against the current count (a trial that wins
            # costs nothing): charging whole trial steps used up the budget within a server's first
            # seconds and kept it on the safe count.
            self._probe_seconds += max(0.0, seconds - _median(kind.times[kind.current]))
            self._trial_step(kind, threads, seconds)
            return
        recent = kind.times.get(threads)
        if recent is None:  # (not setdefault: its new deque would be built every step)
            recent = kind.times[threads] = deque(maxlen=PROBE_STEPS)
        # On all cores, a neighbour turning busy makes every step many times slower: the second such
        # step in a row tries the safe count at once (judged against the recent steps, slow ones
        # included). Not the first: behind the HTTP server an event-loop burst or a niced neighbour's
        # slice lands on one step now and then, and a trial for each cost ~10% of a real model's steps.
        slow = threads != self.choices[0] and bool(recent)
        slow = slow and seconds > GIVE_UP * _median(recent)
        kind.slow_steps = kind.slow_steps + 1 if slow else 0
        alarm = kind.slow_steps >= 2
        recent.append(seconds)
        kind.countdown -= 1
        due = kind.countdown <= 0 and len(recent) == PROBE_STEPS
        if alarm or (due and self._may_try(kind)):
            kind.slow_steps = 0
            kind.probing = PROBE_STEPS
            kind.times.pop(self._other(kind.current), None)  # judge the other on fresh steps only

    def _may_try(self, kind: _Kind) -> bool:
        if kind.current != self.choices[0]:
            return True  # trying the safe count costs little
        if self._probe_seconds > PROBE_BUDGET * self._seconds:
            return False
        load = self._other_load()
        if load is not None and load >= IDLE_CORES:
            kind.countdown = MIN_INTERVAL  # others are busy (or not measured yet): ask again later
            return False
        return True  # idle, or no way to tell (not Linux): then the budget alone bounds the cost

    def _trial_step(self, kind: _Kind, threads: int, seconds: float) -> None:
        kind.probing -= 1
        risky = threads != self.choices[0]
        if risky and seconds > GIVE_UP * _median(kind.times[kind.current]):
            kind.probing = 0  # clearly slower on all cores: no need to pay for more steps
            self._keep(kind)
            return
        kind.times.setdefault(threads, deque(maxlen=PROBE_STEPS)).append(seconds)
        if not kind.probing:
            self._decide(kind)

    def _decide(self, kind: _Kind) -> None:
        other = self._other(kind.current)
        ours, theirs = (_median(kind.times[t]) for t in (kind.current, other))
        if theirs < ours * MARGIN:
            kind.current, kind.interval = other, MIN_INTERVAL
            kind.countdown = kind.interval
        else:
            self._keep(kind)

    def _keep(self, kind: _Kind) -> None:
        kind.interval = min(2 * kind.interval, MAX_INTERVAL)
        kind.countdown = kind.interval

    def _kind(self, num_tokens: int) -> _Kind:
        if num_tokens == self._last[0]:  # the same size as the last step (a decode stream): its kind
            return self._last[1]
        key = min(num_tokens.bit_length(), 10)  # 1, 2-3, 4-7, ... 512+ tokens
        kind = self._kinds.get(key)
        if kind is None:
            # A first step of its kind (rare ones, like long prefills, may never see a trial) runs
            # on all cores if the machine is otherwise idle.
            kind = self._kinds[key] = _Kind(self.choices[1] if self._idle() else self.choices[0])
        self._last = (num_tokens, kind)
        return kind

    def _idle(self) -> bool:
        load = self._other_load()
        return load is not None and load < IDLE_CORES

    def _other(self, threads: int) -> int:
        return self.choices[1] if threads == self.choices[0] else self.choices[0]


def _median(values: Iterable[float]) -> float:
    """statistics.median's value (the mean of the middle two for an even count), without its type
    dispatch: `record` runs every step, on caches the step's weights have just flushed (#34)."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2
