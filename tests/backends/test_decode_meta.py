"""A one-token decode step's attention metadata (`AttentionMetadata._one_decode`, taken by `from_batch`)
holds the same tensors as the general builder (`_rows`): dtype, shape, values, None-ness, for block tables
that are and are not consecutive, on a block boundary and inside a block."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localchat.backends.torch.attention_meta import AttentionMetadata
from localchat.engine.batch import build_batch
from localchat.engine.interface import SchedulerOutput
from localchat.engine.request import Request
from localchat.engine.sampling_params import SamplingParams

BS = 16
CPU = torch.device("cpu")


def _same(a: object, b: object, where: str) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, where
        assert torch.equal(a, b), where
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), where
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("blocks", [[5], [3, 4, 5], [7, 2, 9], [1, 2, 4, 5]])
@pytest.mark.parametrize("in_last", [1, 9, 16])  # tokens of the last block this step fills
def test_one_decode_token_matches_the_general_metadata(blocks: list[int], in_last: int) -> None:
    num_tokens = (len(blocks) - 1) * BS + in_last  # after this step's token
    request = Request("a", list(range(num_tokens)), SamplingParams(temperature=0))
    request.block_ids = list(blocks)
    request.num_computed_tokens = num_tokens - 1
    batch = build_batch(SchedulerOutput([], [], {"a": 1}, 1), {"a": request}, BS)
    fast = AttentionMetadata.from_batch(batch, CPU, 2)
    general = AttentionMetadata._rows(batch, CPU, 2)
    for name in AttentionMetadata.__slots__:
        _same(getattr(fast, name), getattr(general, name), name)
    consecutive = all(b == blocks[0] + i for i, b in enumerate(blocks))
    assert (fast.decode_span is not None) == consecutive
    assert int(fast.slot_mapping[0]) == blocks[-1] * BS + in_last - 1
