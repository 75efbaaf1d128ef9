"""The per-step thread governor (localchat/backends/torch/cpu/threads.py) against simulated step times."""

from __future__ import annotations

from collections.abc import Callable

from localchat.backends.torch.cpu import threads
from localchat.backends.torch.cpu.threads import OtherLoad, ThreadGovernor, busy_ticks

SAFE, ALL = 1, 2
StepTime = Callable[[int, int], float]  # (threads, num_tokens) -> seconds


def make(other_load: list[float | None] | None = None) -> ThreadGovernor:
    """`other_load[0]`: cores the machine's other processes use (None: not measurable); default idle."""
    load = other_load if other_load is not None else [0.0]
    return ThreadGovernor((SAFE, ALL), other_load=lambda: load[0])


def run(gov: ThreadGovernor, step_time: StepTime, steps: int, num_tokens: int = 1) -> list[int]:
    """Drive `steps` steps; returns the thread count each ran with."""
    used = []
    for _ in range(steps):
        count = gov.threads_for(num_tokens)
        gov.record(num_tokens, count, step_time(count, num_tokens))
        used.append(count)
    return used


def idle(count: int, num_tokens: int) -> float:
    return 0.014 if count == ALL else 0.020


def busy_neighbour(count: int, num_tokens: int) -> float:
    return 1.2 if count == ALL else 0.025  # the barrier collapse measured on the dev box


def test_an_idle_box_runs_on_all_cores() -> None:
    used = run(make(), idle, 40)
    assert used[0] == ALL  # a new kind of step starts on all cores when nothing else runs
    assert used.count(SAFE) <= 6  # the safe count only comes back for short, rarer trials


def test_a_box_that_turns_idle_moves_to_all_cores_soon() -> None:
    load: list[float | None] = [1.0]
    gov = make(load)
    assert run(gov, idle, 3) == [SAFE] * 3
    load[0] = 0.0
    used = run(gov, idle, 40)
    assert used.index(ALL) < 20 and used[-20:].count(ALL) >= 17


def test_all_cores_are_not_tried_while_other_processes_are_busy() -> None:
    load: list[float | None] = [1.0]
    gov = make(load)
    assert ALL not in run(gov, idle, 200)
    load[0] = 0.1  # the neighbour is done: never tried on all cores, so it moves there at once
    used = run(gov, idle, 60)
    assert used[0] == ALL and used[-15:].count(ALL) >= 12  # (a short trial of the safe count)


def test_a_rare_kind_started_while_busy_moves_to_all_cores_once_idle() -> None:
    load: list[float | None] = [1.0]
    gov = make(load)
    assert run(gov, idle, 1, num_tokens=16) == [SAFE]  # e.g. a server's first request during a load
    load[0] = 0.0
    assert run(gov, idle, 2, num_tokens=16) == [ALL, ALL]  # one step a request: no trial would come


def test_when_all_cores_lose_to_our_own_other_threads_the_safe_count_takes_over() -> None:
    def http_thread_competes(count: int, num_tokens: int) -> float:
        return 0.032 if count == ALL else 0.024  # measured behind the HTTP server: 32 vs 42 tok/s

    used = run(make(), http_thread_competes, 200)
    assert used[0] == ALL and used[-100:].count(SAFE) >= 97


def test_without_a_load_reading_trials_stay_within_the_time_budget() -> None:
    gov = make([None])
    used = run(gov, busy_neighbour, 5000)
    spent = sum(busy_neighbour(c, 1) for c in used)
    on_all = sum(busy_neighbour(c, 1) for c in used if c == ALL)
    assert on_all <= threads.PROBE_BUDGET * spent + busy_neighbour(ALL, 1)  # + the trial that overshoots
    assert used[-100:] == [SAFE] * 100


def test_a_neighbour_turning_busy_sends_it_back_after_two_slow_steps() -> None:
    load: list[float | None] = [0.0]
    gov = make(load)
    assert run(gov, idle, 100)[-1] == ALL
    load[0] = 1.0
    used = run(gov, busy_neighbour, 30)
    assert used[:2] == [ALL, ALL] and used[2:] == [SAFE] * 28  # the alarm, then trials judge ALL unfit


def test_one_slow_step_now_and_then_keeps_all_cores() -> None:
    steps = iter(range(10**6))

    def hiccups(count: int, num_tokens: int) -> float:
        # behind the HTTP server on the real 1.5B model: 24 ms on two threads, 30 on one, every 25th
        # step of two hit by an event-loop burst or a niced neighbour's slice
        if count == SAFE:
            return 0.030
        return 0.045 if next(steps) % 25 == 24 else 0.024

    used = run(make(), hiccups, 600)
    assert used[-300:].count(ALL) >= 297  # no trial of the safe count for each slow step


def test_each_kind_of_step_keeps_its_own_choice() -> None:
    def contended_decode(count: int, num_tokens: int) -> float:
        # One-token steps lose on all cores (an HTTP thread competes), long ones gain.
        return (0.032 if count == ALL else 0.024) if num_tokens == 1 else idle(count, num_tokens) * 30

    gov = make()
    prefill, decode = [], []
    for _ in range(60):
        prefill += run(gov, contended_decode, 1, num_tokens=512 + len(prefill))  # all in one bucket
        decode += run(gov, contended_decode, 5, num_tokens=1)
    assert prefill[-30:].count(ALL) >= 25 and decode[-100:].count(SAFE) >= 97


def test_noise_below_the_margin_does_not_switch() -> None:
    def almost_equal(count: int, num_tokens: int) -> float:
        return 0.0195 if count == ALL else 0.020

    used = run(make([None]), almost_equal, 500)  # load unknown: starts on the safe count
    assert used[0] == SAFE and used[-100:].count(SAFE) >= 94


def test_other_load_reads_proc_stat_on_linux() -> None:
    load = OtherLoad()
    value = load()
    assert value is None or value == float("inf")  # unknown before a full window has passed


def test_niced_neighbours_do_not_count_against_all_cores_unless_we_are_niced() -> None:
    # /proc/stat's first line: user nice system idle iowait irq softirq steal (guest, guest_nice)
    line = "cpu  1000 500 200 9000 50 10 20 5 0 0"
    assert busy_ticks(line, 0) == 1000 + 200 + 10 + 20 + 5
    assert busy_ticks(line, 19) == 1000 + 500 + 200 + 10 + 20 + 5
    with open("/proc/stat") as f:  # the real line parses (Linux)
        assert busy_ticks(f.readline(), 0) >= 0
