"""Waiting for something to become true in a test: poll it until a deadline instead of sleeping a guessed
time and asserting. A poll returns as soon as the condition holds (fast on an idle machine) and still
passes on a loaded one, where a fixed sleep is either too short (flaky) or too long (slow)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 10, what: str = "", interval: float = 0.01) -> T:
    """Call `condition` until it returns something truthy, and return that; AssertionError naming `what`
    once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s: {what or condition}")
        time.sleep(interval)
    return value


async def async_wait_until(
    condition: Callable[[], T], timeout: float = 10, what: str = "", interval: float = 0.01
) -> T:
    """`wait_until` inside an event loop: the loop keeps running while it waits."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s: {what or condition}")
        await asyncio.sleep(interval)
    return value
