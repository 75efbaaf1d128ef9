"""Images in the engine (#29): prefix-cache block hashes fold in the pictures' content hashes, and each
step's batch says which rows of which image its prefill chunk carries."""

from __future__ import annotations

from localchat.engine.batch import build_batch
from localchat.engine.block_manager import BlockManager
from localchat.engine.interface import SchedulerOutput
from localchat.engine.request import ImageInput, Request
from localchat.engine.sampling_params import SamplingParams

BS = 4
IMG = 99  # the placeholder token id: the same for every picture
PROMPT = [1, 2, IMG, IMG, IMG, IMG, 3, 4, 5, 6]


def _request(req_id: str, content_hash: str) -> Request:
    request = Request(req_id, list(PROMPT), SamplingParams(max_tokens=4))
    request.images = (ImageInput((2, 3, 4, 5), content_hash),)
    return request


def _run_and_free(bm: BlockManager, request: Request) -> None:
    assert bm.allocate_slots(request, request.num_tokens) is not None
    request.num_computed_tokens = request.num_tokens
    bm.free(request)


def test_another_picture_misses_the_prefix_cache_and_the_same_picture_hits() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    _run_and_free(bm, _request("a", "cat"))
    # Same placeholder ids, another picture: both blocks holding image tokens must miss.
    assert bm.get_computed_blocks(_request("b", "dog")) == []
    # Same picture: both full blocks (positions 0..7) are reused.
    assert len(bm.get_computed_blocks(_request("c", "cat"))) == 2


def test_text_only_blocks_hash_as_before_images() -> None:
    """A block with no placeholder keeps the plain hash, so text prompts share cache with old entries."""
    bm = BlockManager(num_blocks=16, block_size=BS)
    text = Request("t", list(PROMPT), SamplingParams(max_tokens=4))
    _run_and_free(bm, text)
    imaged = _request("i", "cat")
    imaged.images = (ImageInput((8, 9), "cat"),)  # only in the third (partial) block
    assert len(bm.get_computed_blocks(imaged)) == 2


def test_batch_carries_each_chunks_slice_of_the_image() -> None:
    request = _request("r", "cat")
    request.block_ids = [1, 2, 3]
    first = build_batch(SchedulerOutput([], [], {"r": 4}, 4), {"r": request}, block_size=BS)
    assert [(s.token_rows, s.embed_rows) for s in first.image_slices] == [([2, 3], [0, 1])]
    request.num_computed_tokens = 4
    second = build_batch(SchedulerOutput([], [], {"r": 6}, 6), {"r": request}, block_size=BS)
    assert [(s.token_rows, s.embed_rows) for s in second.image_slices] == [([0, 1], [2, 3])]
    assert second.image_slices[0].image.content_hash == "cat"
