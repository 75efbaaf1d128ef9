"""Chunked prefill never cuts a picture's run for models that attend over it both ways (Gemma 3): the
scheduler stops a chunk before the picture, or gives the step the whole run past the chunk size, also
after a prefix-cache hit that ends inside the picture; with the flag off it chunks as before."""

from __future__ import annotations

from localchat.engine.block_manager import BlockManager
from localchat.engine.config import EngineConfig
from localchat.engine.request import ImageInput, Request
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.scheduler import Scheduler
from localchat.vision.picture_runs import picture_runs, whole_picture_end

IMG = 99
PROMPT = [1, 2, IMG, IMG, IMG, IMG, IMG, 3, 4, 5, 6, 7]  # the picture at positions 2..6


def test_runs_and_chunk_ends() -> None:
    assert picture_runs((9, 3, 4, 5, 8)) == [(3, 6), (8, 10)]
    image = ImageInput((2, 3, 4, 5, 6), "cat")
    assert whole_picture_end([image], 0, 4) == 2  # back to the picture's start
    assert whole_picture_end([image], 2, 4) == 7  # the chunk starts at the picture: all of it
    assert whole_picture_end([image], 3, 5) == 7  # a prefix hit inside the picture: the rest of it
    assert whole_picture_end([image], 0, 2) == 2 and whole_picture_end([image], 0, 7) == 7  # no cut


def _steps(whole_pictures: bool, chunk: int) -> list[int]:
    config = EngineConfig(block_size=4, prefill_chunk_size=chunk, max_num_batched_tokens=64)
    scheduler = Scheduler(config, BlockManager(num_blocks=32, block_size=4, enable_prefix_caching=False))
    scheduler.whole_pictures = whole_pictures
    request = Request("r", list(PROMPT), SamplingParams(max_tokens=4))
    request.images = (ImageInput((2, 3, 4, 5, 6), "cat"),)
    scheduler.add_request(request)
    sizes = []
    while request.num_computed_tokens < request.num_tokens:
        out = scheduler.schedule()
        sizes.append(out.num_scheduled_tokens["r"])
        request.num_computed_tokens += sizes[-1]
    return sizes


def test_the_scheduler_keeps_a_picture_in_one_step() -> None:
    assert _steps(True, 4) == [2, 5, 4, 1]  # [0, 2) [2, 7) [7, 11) [11, 12)
    assert _steps(True, 6) == [2, 6, 4]  # [0, 2) [2, 8) [8, 12)
    assert _steps(False, 4) == [4, 4, 4]  # causal models: cut anywhere
