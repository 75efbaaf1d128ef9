"""Partial prefix reuse for prompts with pictures (engine/block_manager.py `find_partial`): a cached
block's first k slots are copied only where the tokens and the pictures (content hash and placeholder
positions) are the same, and never up to a cut inside a picture. The engine tests run the fake runner,
which checks every context it reads token by token (pictures are the torch test's part:
tests/backends/test_partial_prefix_pictures_torch.py)."""

from __future__ import annotations

from localchat.engine.block_manager import BlockManager
from localchat.engine.request import ImageInput, Request
from localchat.engine.sampling_params import SamplingParams
from tests.helpers.fake_engine import drain, fake_engine

BS = 4
IMG = 99  # the placeholder id: the same for every picture
# positions 0-1 text, 2-5 the picture, 6-9 text: blocks [0-3] [4-7] [8-9]
PROMPT = [1, 2, IMG, IMG, IMG, IMG, 3, 4, 5, 6]
PLACES = (2, 3, 4, 5)


def request(req_id: str, tokens: list[int], *pictures: tuple[tuple[int, ...], str]) -> Request:
    out = Request(req_id, list(tokens), SamplingParams(max_tokens=8))
    out.images = tuple(ImageInput(places, digest) for places, digest in pictures)
    return out


def admit(
    bm: BlockManager, req: Request, upto: int | None = None
) -> tuple[list[int], tuple[int, int] | None]:
    """Admit `req` for its tokens up to `upto` (a prefill chunk; default all)."""
    hits = bm.get_computed_blocks(req)
    partial = bm.find_partial(req, hits)
    req.num_computed_tokens = len(hits) * BS + (partial[1] if partial else 0)
    end = req.num_tokens if upto is None else upto
    assert bm.allocate_slots(req, end - req.num_computed_tokens, hits, partial=partial)
    bm.end_step()
    return hits, partial


def served(bm: BlockManager, req: Request, computed: int | None = None) -> None:
    """The request ran (its first `computed` tokens, default all) and ended."""
    admit(bm, req, computed)
    req.num_computed_tokens = req.num_tokens if computed is None else computed
    bm.free(req)


def test_the_same_picture_repeated_copies_all_but_the_last_token() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, keep_tails=True)
    served(bm, request("a", PROMPT, (PLACES, "cat")))
    b = request("b", PROMPT, (PLACES, "cat"))
    hits, partial = admit(bm, b)
    assert len(hits) == 2 and partial is not None and partial[1] == 1  # token 9 is the one computed
    assert b.num_computed_tokens == len(PROMPT) - 1


def test_a_prompt_sharing_text_and_picture_copies_up_to_where_they_part() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, keep_tails=True)
    served(bm, request("a", PROMPT, (PLACES, "cat")))
    b = request("b", [1, 2, IMG, IMG, IMG, IMG, 3, 7, 7, 7], (PLACES, "cat"))
    hits, partial = admit(bm, b)
    assert len(hits) == 1 and partial is not None and partial[1] == 3  # positions 4, 5 (the picture), 6


def test_another_picture_at_the_same_positions_is_not_copied() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, keep_tails=True)
    served(bm, request("a", PROMPT, (PLACES, "cat")))
    b = request("b", PROMPT, (PLACES, "dog"))
    # Block 1 (positions 0-3) holds two of the picture's rows: neither a whole-block hit nor a copy past
    # position 2, where the picture begins.
    hits, partial = admit(bm, b)
    assert hits == [] and partial is not None and partial[1] == 2
    # The same tokens as a text prompt: only the text before the picture's first placeholder (from a's
    # block or b's, both named now).
    c = request("c", PROMPT)
    found = bm.find_partial(c, bm.get_computed_blocks(c))
    assert found is not None and found[1] == 2


def test_a_picture_cut_by_the_cached_tokens_is_copied_whole_or_not_at_all() -> None:
    """a stopped (preempted or aborted) after 5 tokens: its tail block [4, 5) holds the picture's row 4
    but not its row 5. Copying that row would split the picture, which a model that sees pictures both
    ways computes as one: the copy stops before the picture instead."""
    bm = BlockManager(num_blocks=16, block_size=BS, keep_tails=True)
    tokens = [1, 2, 3, 4, 5, IMG, IMG, IMG, 6, 7, 8]
    places = (5, 6, 7)
    served(bm, request("a", tokens, (places, "cat")), computed=6)  # the tail: positions 4, 5
    b = request("b", tokens, (places, "cat"))
    hits = bm.get_computed_blocks(b)
    assert len(hits) == 1
    assert bm.find_partial(b, hits) == (2, 1)  # position 4 only: the picture starts at 5
    # A tail that holds only the picture's first rows and nothing before them: no copy at all.
    bm = BlockManager(num_blocks=16, block_size=BS, keep_tails=True)
    tokens = [1, 2, 3, 4, IMG, IMG, IMG, 6, 7]
    served(bm, request("a", tokens, ((4, 5, 6), "cat")), computed=6)
    b = request("b", tokens, ((4, 5, 6), "cat"))
    hits = bm.get_computed_blocks(b)
    assert len(hits) == 1 and bm.find_partial(b, hits) is None


def test_a_picture_that_ends_in_the_block_is_copied_with_its_block() -> None:
    """The picture began in the whole-block hits and ends inside the copied block: all of it is the same
    picture at the same positions (the hits' hashes fold its content in), so the copy goes past it."""
    bm = BlockManager(num_blocks=16, block_size=BS, keep_tails=True)
    tokens = [1, 2, IMG, IMG, IMG, IMG, IMG, 3, 4, 5]  # picture 2-6, blocks [0-3] [4-7] [8-9]
    served(bm, request("a", tokens, ((2, 3, 4, 5, 6), "cat")))
    b = request("b", [*tokens[:8], 9, 9], ((2, 3, 4, 5, 6), "cat"))
    hits = bm.get_computed_blocks(b)
    assert len(hits) == 2  # [0-3], [4-7]
    c = request("c", [*tokens[:6], 7, 7, 7], ((2, 3, 4, 5), "cat"))  # the picture is one row shorter
    hits = bm.get_computed_blocks(c)
    assert len(hits) == 1  # block [0-3]: the same tokens, the same picture's content hash
    partial = bm.find_partial(c, hits)
    # Block [4-7] holds a's picture up to position 6; c's picture ends at 5: not the same picture.
    assert partial is None


def test_engine_repeat_with_a_picture_reads_the_right_context() -> None:
    """Through the engine and the fake runner (which checks every context it reads): the repeat computes
    one token, another picture at the same positions computes everything from the picture on."""
    engine = fake_engine(block_size=4)
    prompt = [5, 6, 7, *[IMG] * 9, 8, 9, 10, 11, 12]
    places = tuple(range(3, 12))

    def run(digest: str) -> int:
        image = ImageInput(places, digest)
        engine.add_request(prompt, SamplingParams(max_tokens=3), images=(image,))
        return next(o for o in drain(engine) if o.finished).num_cached_tokens

    assert run("cat") == 0
    assert run("cat") == len(prompt) - 1
    assert run("dog") == 3  # the text before the picture
    assert run("dog") == len(prompt) - 1
