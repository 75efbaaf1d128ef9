"""What the vision parity tests share (tests/backends/test_*vision*.py): a picture prompt prefilled in
steps (a boundary inside the picture's run), every prompt token's logits held to transformers', then
greedy steps after the picture; transformers' own greedy tokens; and the engine run of each picture twice,
the second turn from the prefix cache, with one encode per picture.

Each family keeps what is its own (the prompt, the pixels, transformers' forward for it) and hands it in
as a callable; the loops and the assertions live here, so every family is held to the same checks.
Tolerance: tests/helpers/parity.py's ATOL (1e-4 on fp32 logits; a wrong row or position moves them >1e-2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import ImageSlice
from localchat.engine.request import ImageInput
from localchat.engine.sampling_params import SamplingParams
from localchat.vision.placement import chunk_rows
from tests.helpers.parity import ATOL, as_numpy
from tests.helpers.torch_batch import PagedDriver

# transformers' logits [len(tokens), vocab] for these tokens, with the test's picture
Reference = Callable[[list[int]], np.ndarray]
# our logits [end - start, vocab] for one prefill step over prompt positions [start, end)
PrefillStep = Callable[[int, int], np.ndarray]

REQ = "a"


def spans(length: int, chunk: int | None) -> list[tuple[int, int]]:
    """The prefill's steps: the whole prompt at once, or two steps with the boundary at `chunk`."""
    return [(0, length)] if chunk is None else [(0, chunk), (chunk, length)]


def scattered_rows(driver: PagedDriver, placeholders: Sequence[int], embeds: torch.Tensor) -> PrefillStep:
    """Steps that hand the picture's rows (encoded once, whole) straight to the model's `image_embeds`:
    what the text model does with them, apart from the runner's tower and encoder cache."""
    model: Any = driver.runner.model

    def step(start: int, end: int) -> np.ndarray:
        rows, picked = chunk_rows(list(placeholders), start, end)
        model.image_embeds = (torch.tensor(rows), embeds[picked])
        try:
            _, logits = driver.step_logits({REQ: end - start}, every_token=True)
        finally:
            model.image_embeds = None  # the greedy steps after the picture carry no rows
        return as_numpy(logits)

    return step


def image_slices(driver: PagedDriver, image: ImageInput, *, only_with_rows: bool = False) -> PrefillStep:
    """Steps whose batch carries the picture's slice: the runner encodes the picture (once, then from its
    encoder cache) and scatters the slice's rows. `only_with_rows`: no slice in a step without any of the
    picture's rows, as engine/batch.py builds them (else an empty one)."""

    def step(start: int, end: int) -> np.ndarray:
        out, batch = driver.build({REQ: end - start}, every_token=True)
        token_rows, embed_rows = chunk_rows(list(image.placeholders), start, end)
        if token_rows or not only_with_rows:
            batch.image_slices = [ImageSlice(image, token_rows, embed_rows)]
        return as_numpy(driver.runner.compute_logits(out, batch))

    return step


def assert_prefill_and_greedy(
    driver: PagedDriver,
    prompt: list[int],
    steps: list[tuple[int, int]],
    step: PrefillStep,
    reference: Reference,
    label: str,
    *,
    greedy: int = 3,
    atol: float = ATOL,
    without_picture: Reference | None = None,
) -> np.ndarray:
    """Prefill `prompt` in `steps`: every token's logits within `atol` of transformers'; then `greedy` decode
    steps whose argmax is transformers' on the same tokens. `without_picture`: transformers with other
    pixels, whose last prompt logits must differ (the picture matters to the model). Returns theirs."""
    driver.add(REQ, prompt)
    ours = np.concatenate([step(start, end) for start, end in steps])
    theirs = reference(prompt)
    assert ours.shape == theirs.shape
    err = float(np.abs(ours - theirs).max())
    print(f"{label} image prompt logits max abs err fp32 (steps {steps}): {err:.2e}")
    assert err < atol
    for _ in range(greedy):  # greedy decode after the picture: no image rows in these steps
        driver.feed(REQ, int(ours[-1].argmax()))
        _, logits = driver.step_logits()
        ours = as_numpy(logits)
        assert int(ours[0].argmax()) == int(reference(driver.tokens(REQ))[-1].argmax())
    if without_picture is not None:
        assert np.abs(theirs[-1] - without_picture(prompt)[-1]).max() > 1e-3
    return theirs


def assert_encoded_once(runner: Any, image: ImageInput, steps: list[tuple[int, int]]) -> None:
    """The picture went through the tower once; each later step with its rows took them from the cache."""
    with_rows = sum(1 for start, end in steps if any(start <= p < end for p in image.placeholders))
    assert (runner.images.cache.misses, runner.images.cache.hits) == (1, with_rows - 1)


def hf_greedy(
    reference: Callable[[list[int]], np.ndarray | torch.Tensor], prompt: list[int], new: int
) -> list[int]:
    """transformers' greedy tokens after `prompt`, a full forward per token."""
    tokens = list(prompt)
    for _ in range(new):
        tokens.append(int(reference(tokens)[-1].argmax()))
    return tokens[len(prompt) :]


def small_engine(runner: Any, tokenizer: Any, chunk: int, model_max_len: int) -> LLMEngine:
    """A small engine (4 MiB of 4-token blocks, so a picture spans many blocks) without stop tokens."""
    config = EngineConfig(kv_cache_mib=4, block_size=4, prefill_chunk_size=chunk)
    return LLMEngine(runner, tokenizer, config, eos_token_ids=[], model_max_len=model_max_len)


def greedy_request(
    engine: LLMEngine, prompt: list[int], images: Sequence[ImageInput], new: int
) -> tuple[list[int], int]:
    """Run one greedy request to its end: (its new tokens, the prompt tokens it found in the prefix cache)."""
    req = engine.add_request(prompt, SamplingParams(max_tokens=new, temperature=0.0), images=tuple(images))
    tokens: list[int] = []
    cached = 0
    while engine.has_unfinished:
        for out in engine.step():
            if out.req_id == req:
                tokens += out.new_token_ids
                cached = out.num_cached_tokens
    return tokens, cached


@dataclass(frozen=True)
class Case:
    """One picture's request: `images` is called for each turn (fresh inputs, so the second turn finds the
    picture by its content hash alone); `expected` gives transformers' greedy tokens."""

    name: str
    prompt: list[int]
    images: Callable[[], Sequence[ImageInput]]
    expected: Callable[[], list[int]]


def inputs_for(
    placeholders: Sequence[int], content_hash: str, pixels: Any
) -> Callable[[], tuple[ImageInput]]:
    """A Case's `images` for a prompt with one picture: a new ImageInput each turn."""
    return lambda: (ImageInput(tuple(placeholders), content_hash, pixels),)


def assert_twice_from_the_caches(engine: LLMEngine, cases: Sequence[Case], new: int) -> list[list[int]]:
    """Each picture twice: the second turn gives the same tokens from the prefix cache (its blocks up to the
    last partial one reused), the first gives transformers' greedy tokens; one encode per picture, and
    different pictures give different answers. Returns the answers."""
    answers = []
    for case in cases:
        first, _ = greedy_request(engine, case.prompt, case.images(), new)
        second, cached = greedy_request(engine, case.prompt, case.images(), new)
        assert second == first and cached >= len(case.prompt) - 4, case.name  # the picture's blocks reused
        assert first == case.expected(), case.name
        answers.append(first)
    runner: Any = engine.runner
    assert runner.images.cache.misses == len(cases)
    assert len({tuple(a) for a in answers}) == len(answers)  # the picture matters to the answer
    return answers
