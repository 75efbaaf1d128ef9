"""Images through the engine and the torch runner (#29) on a tiny random Gemma 3 folder, fp32: a request
carrying a picture decodes greedily as transformers does on the same pixels (with the token_type_ids its
processor passes: the picture's tokens attend to each other both ways), also when the chunk size would end
inside the image's run (the scheduler then stops the chunk before the picture); another picture gives other tokens; the same picture again hits the encoder cache
and the prefix cache, another one hits neither past its first image block."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.engine.engine import LLMEngine
from localchat.engine.request import ImageInput
from localchat.engine.sampling_params import SamplingParams
from localchat.vision.gemma3_preprocess import ImageSpec, content_hash, decode, preprocess
from localchat.weights.loader import load_model
from tests.backends.test_gemma3_vision import _hf_logits, _pictures, saved  # noqa: F401 (fixture)
from tests.helpers.picture_parity import greedy_request, hf_greedy, small_engine
from tests.helpers.torch_models import fp32_runner

PROMPT = [5, 17, 297, 299, 299, 299, 299, 298, 42, 7]
NEW = 5


def _engine(folder: Path, chunk: int) -> LLMEngine:
    bundle = load_model(folder)
    return small_engine(fp32_runner(bundle), bundle.tokenizer, chunk, 64)


def _generate(engine: LLMEngine, image: ImageInput, prompt: list[int] = PROMPT) -> tuple[list[int], int]:
    """Greedy tokens and the prompt tokens that came from the prefix cache."""
    return greedy_request(engine, list(prompt), (image,), NEW)


def _hf_greedy(hf: torch.nn.Module, pixels: np.ndarray) -> list[int]:
    return hf_greedy(partial(_hf_logits, hf, pixels=torch.from_numpy(pixels)[None]), PROMPT, NEW)


@pytest.mark.parametrize("chunk", [0, 5])
def test_greedy_with_an_image_matches_transformers(
    saved: tuple[torch.nn.Module, Path],  # noqa: F811
    tmp_path: Path,
    chunk: int,
) -> None:
    hf, folder = saved
    spec = ImageSpec.from_folder(folder, 56)
    pictures = [(preprocess(decode(b), spec), content_hash(b)) for b in _pictures(tmp_path)]
    images = [ImageInput((3, 4, 5, 6), h, pixels) for pixels, h in pictures]
    engine = _engine(folder, chunk)
    first, _ = _generate(engine, images[0])
    assert first == _hf_greedy(hf, pictures[0][0])
    embedder = engine.runner.images  # type: ignore[attr-defined]
    assert engine.scheduler.whole_pictures
    # encoded once; no chunk cuts the picture (steps [0, 3), [3, 8), [8, 10) at chunk 5), so no second look
    assert (embedder.cache.misses, embedder.cache.hits) == (1, 0)
    again, cached = _generate(engine, images[0])  # the same picture again
    assert again == first
    assert cached == 9  # both full blocks of the 10-token prompt, image included, and one token copied
    # another first token: the prefix cache misses, the encoder cache does not
    hits = embedder.cache.hits
    _generate(engine, images[0], [6, *PROMPT[1:]])
    assert (embedder.cache.misses, embedder.cache.hits) == (1, hits + 1)
    second, cached = _generate(engine, images[1])
    assert second == _hf_greedy(hf, pictures[1][0])
    assert second != first
    # Both full blocks hold part of the other picture: only the text before it (tokens 0-2) is copied.
    assert cached == 3
    assert embedder.cache.misses == 2


def test_a_prefix_hit_that_ends_inside_the_picture_matches_transformers(
    saved: tuple[torch.nn.Module, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The cached block [0, 4) holds the picture's first token (computed when the whole picture was seen);
    the next request reuses it and computes the rest of the picture in one step, its rows seeing that key:
    its first token's logprob is transformers' (a chunk of 2 cutting the picture would not give it).
    With the block [4, 8) still cached, the picture's other rows are copied from it too (partial reuse,
    the picture whole): the same logprob."""
    hf, folder = saved
    data = _pictures(tmp_path)[0]
    pixels = preprocess(decode(data), ImageSpec.from_folder(folder, 56))
    image = ImageInput((3, 4, 5, 6), content_hash(data), pixels)
    other = [*PROMPT[:7], 297, *PROMPT[8:]]  # differs in the second block, after the picture
    theirs = torch.log_softmax(
        torch.from_numpy(_hf_logits(hf, other, torch.from_numpy(pixels)[None])[-1]), -1
    )
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=0)
    for evict, cached in ((True, 4), (False, 7)):
        engine = _engine(folder, 2)  # a chunk of 2 would cut the picture twice
        _generate(engine, image)
        if evict:  # a 10-token prompt of other tokens takes the freed blocks but [0, 4), last freed
            engine.block_manager.cache_reserve_blocks = 0  # (else it takes never-used blocks: room left)
            engine.add_request([9] * 10, SamplingParams(max_tokens=1))
            while engine.has_unfinished:
                engine.step()
        req_id = engine.add_request(list(other), params, images=(image,))
        outs = [
            out for _ in range(8) if engine.has_unfinished for out in engine.step() if out.req_id == req_id
        ]
        assert outs[-1].num_cached_tokens == cached
        logprob = next(lp for out in outs for lp in out.logprobs)
        assert logprob.token_id == int(theirs.argmax())
        assert abs(logprob.logprob - float(theirs.max())) < 1e-4
