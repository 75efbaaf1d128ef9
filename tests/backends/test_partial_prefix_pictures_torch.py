"""Partial prefix reuse with pictures on a real model (engine/block_manager.py `find_partial`): the tiny
random LLaVA (CLIP tower + Llama, tests/helpers/llava_models.py) through LLMEngine + TorchRunner, fp32,
4-token blocks. A repeated picture prompt computes one token and a prompt sharing its text and picture
computes only where it parts; both give the greedy tokens and logprobs of a cold run (prefix caching
off). Another picture at the same positions reuses only the text before it: its answer is its own cold
run's, which differs from the first picture's (were the picture's K/V reused, it would not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.request import ImageInput
from localchat.engine.sampling_params import SamplingParams
from localchat.vision.gemma3_preprocess import content_hash
from localchat.vision.llava_prompt import LlavaImagePrompt
from localchat.vision.model_info import vision_config
from localchat.weights.loader import load_model
from tests.helpers import llava_models as tiny
from tests.helpers.torch_models import fp32_runner

pytestmark = pytest.mark.slow  # builds and saves a tiny LLaVA, runs ~10 engine requests

PICTURE = [tiny.IMAGE] * tiny.TOKENS_PER_IMAGE
# positions 0-1 text, 2-17 the picture, then text: 4-token blocks end at 20; the two prompts part at 19
PROMPT = [1, 3, *PICTURE, 5, 6, 7, 8, 4]
SHARING = [1, 3, *PICTURE, 5, 7, 7, 8, 4, 6]
NEW = 5


def answer(engine: LLMEngine, prompt: list[int], image: ImageInput) -> tuple[list[int], list[float], int]:
    """Greedy tokens, their logprobs, and the prompt tokens found in the prefix cache."""
    params = SamplingParams(max_tokens=NEW, temperature=0.0, logprobs=1)
    req = engine.add_request(prompt, params, images=(image,))
    tokens: list[int] = []
    logprobs: list[float] = []
    cached = -1
    while engine.has_unfinished:
        for out in engine.step():
            assert out.req_id == req and out.error is None, out.error
            tokens += out.new_token_ids
            logprobs += [lp.logprob for lp in out.logprobs]
            cached = out.num_cached_tokens
    return tokens, logprobs, cached


def test_picture_prompts_reuse_down_to_the_token_and_answer_like_a_cold_run(tmp_path: Path) -> None:
    folder = tmp_path / "llava"
    folder.mkdir()
    tiny.write_folder(folder)
    config = vision_config(folder)
    assert config is not None
    prompt_side = LlavaImagePrompt.from_config(folder, config)
    (places,) = prompt_side.placeholders(PROMPT)
    assert prompt_side.placeholders(SHARING) == [places]
    images: dict[str, Any] = {}
    for path in tiny.pictures(tmp_path):
        images[path.name] = (content_hash(path.read_bytes()), prompt_side.preprocess(Image.open(path)))
    cat, dog = images.values()

    def image(which: tuple[str, Any]) -> ImageInput:
        return ImageInput(tuple(places), which[0], which[1])  # a fresh input each time, as a server's

    bundle = load_model(folder)
    runner = fp32_runner(bundle)

    def engine(prefix_caching: bool) -> LLMEngine:
        cfg = EngineConfig(kv_cache_mib=4, block_size=4, enable_prefix_caching=prefix_caching)
        return LLMEngine(runner, bundle.tokenizer, cfg, eos_token_ids=[], model_max_len=128)

    cold = engine(False)
    want = {
        (name, tuple(prompt)): answer(cold, prompt, image(which))[:2]
        for name, which in (("cat", cat), ("dog", dog))
        for prompt in (PROMPT, SHARING)
    }
    assert want[("cat", tuple(PROMPT))][0] != want[("dog", tuple(PROMPT))][0]  # the picture matters

    warm = engine(True)

    def check(name: str, which: tuple[str, Any], prompt: list[int], cached: int) -> None:
        tokens, logprobs, got_cached = answer(warm, prompt, image(which))
        assert got_cached == cached, (name, prompt)
        want_tokens, want_logprobs = want[(name, tuple(prompt))]
        assert tokens == want_tokens, (name, prompt)
        np.testing.assert_allclose(logprobs, want_logprobs, atol=1e-4)

    check("cat", cat, PROMPT, 0)
    check("cat", cat, PROMPT, len(PROMPT) - 1)  # all but the last token: 20 whole, 2 copied
    check("cat", cat, SHARING, 19)  # 16 whole, 3 copied (the picture's last rows, 5), 7 parts
    # Another picture at the same positions: the text before it (positions 0, 1) only.
    check("dog", dog, PROMPT, 2)
    check("dog", dog, SHARING, 19)
    assert warm.block_manager.prefix_hits > 0
