"""top-p orders only the tokens top-k (or a grammar) left (sampler._top_p): the same mask as ordering the
whole vocabulary, which a 152k vocabulary paid ~8 ms a token for (issue #34's Qwen2.5 profile)."""

from __future__ import annotations

import torch

from localchat.backends.torch.sampler import _top_k, _top_p


def full_sort_top_p(logits: torch.Tensor, ps: list[float]) -> torch.Tensor:
    """The reference: sort every token."""
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    limits = torch.tensor([p if p < 1.0 else float("inf") for p in ps])
    drop = mass_before >= limits[:, None]
    drop[:, 0] = False
    return logits.masked_fill(torch.zeros_like(drop).scatter_(1, order, drop), float("-inf"))


def test_top_p_over_the_top_k_candidates_equals_the_full_sort() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 5000) * 3
    ks, ps = [20, 40, 1, 7], [0.8, 0.95, 0.5, 1.0]
    masked = _top_k(logits, ks)
    got = _top_p(masked, ps)
    assert torch.equal(got, full_sort_top_p(masked, ps))
    kept = (got != float("-inf")).sum(dim=-1).tolist()
    assert kept[2] == 1 and kept[3] == 7 and 1 <= kept[0] < 20 and 1 <= kept[1] < 40


def test_a_row_without_top_k_keeps_the_full_sort() -> None:
    torch.manual_seed(1)
    logits = _top_k(torch.randn(2, 3000), [0, 30])
    assert torch.equal(_top_p(logits, [0.9, 0.9]), full_sort_top_p(logits, [0.9, 0.9]))
