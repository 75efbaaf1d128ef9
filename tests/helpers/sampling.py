"""Sampling inputs for sampler tests, built the way the engine builds them (engine/sampling_inputs.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from localchat.engine.sampling_inputs import SamplingInputs, build_sampling_inputs
from localchat.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class Row:
    """One request as the engine knows it: its params and its tokens so far."""

    params: SamplingParams
    prompt: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)


def row(prompt: list[int] | None = None, output: list[int] | None = None, **params: object) -> Row:
    return Row(SamplingParams(**params), prompt or [], output or [])  # type: ignore[arg-type]


def inputs_for(rows: list[Row], bitmask: np.ndarray | None = None) -> SamplingInputs:
    built = build_sampling_inputs([(r.params, r.prompt + r.output, len(r.prompt)) for r in rows])
    built.token_bitmask = bitmask
    return built
