"""The fused paged decode-attention kernel (csrc/lc_attention.h) against the pure-torch decode path.

Both read the same random cache through shuffled block tables (padding slots hold random values too,
so reading past a row's length shows). Tolerances:
- float32 cache and q: both accumulate in float32 in different orders; against a float64 dense
  reference each stays within 1e-5 (the softmax-weighted sums of ~unit values over <= 300 positions
  carry ~1e-6 rounding).
- bfloat16: both upcast the same bfloat16 values and differ only by float32 summation order before
  the output is rounded to bfloat16, so the outputs differ by at most one bfloat16 step (2^-7
  relative, 2^-6 at a binade edge) where the two float32 values straddle a rounding boundary.
Every ISA this CPU runs is checked, plus the portable C one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localchat.backends.torch.attention import AttentionMetadata, AttentionOptions, paged_attention
from localchat.backends.torch.cpu import kernels
from localchat.errors import BackendUnavailableError
from tests.helpers.paged_batches import make_batch

ISAS = kernels.runnable_isas()
pytestmark = pytest.mark.skipif(not ISAS, reason="localchat's CPU kernels are not built")
BLOCK = 16


def dense(q: torch.Tensor, cache: torch.Tensor, table: np.ndarray, length: int, window: int = 0,
          softcap: float = 0.0) -> torch.Tensor:  # fmt: skip
    """float64 attention of one row q [heads, d] over its first `length` positions."""
    slots = (torch.from_numpy(table.astype(np.int64))[:, None] * BLOCK + torch.arange(BLOCK)).reshape(-1)
    first = max(0, length - window) if window else 0
    kv = cache[:, :, slots[first:length]].double()  # [2, kvh, S, d]
    group = q.shape[0] // cache.shape[1]
    keys, values = kv[0].repeat_interleave(group, 0), kv[1].repeat_interleave(group, 0)
    scores = torch.einsum("hd,hsd->hs", q.double(), keys) / q.shape[-1] ** 0.5
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    return torch.einsum("hs,hsd->hd", scores.softmax(-1), values)


class Step:
    """One decode step through paged_attention: its inputs (cache after the step's writes) and output."""

    def __init__(self, lengths: list[int], kv_heads: int, group: int, head_dim: int,
                 dtype: torch.dtype) -> None:  # fmt: skip
        blocks = sum(-(-n // BLOCK) for n in lengths) + 3
        batch = make_batch([(n, 1) for n in lengths], BLOCK, blocks, seed=len(lengths) + head_dim)
        gen = torch.Generator().manual_seed(kv_heads * 100 + group)
        self.cache = torch.randn(2, kv_heads, blocks * BLOCK, head_dim, generator=gen).to(dtype)
        rows = len(lengths)
        self.q = torch.randn(rows, kv_heads * group, head_dim, generator=gen).to(dtype)
        k = torch.randn(rows, kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(rows, kv_heads, head_dim, generator=gen).to(dtype)
        self.tables, self.lengths = batch.block_tables, lengths
        self.meta = AttentionMetadata.from_batch(batch, torch.device("cpu"), kv_heads)
        self.out = paged_attention(self.q, k, v, self.cache, self.meta)

    def reference(self, row: int) -> torch.Tensor:
        return dense(self.q[row], self.cache, self.tables[row], self.lengths[row])


def ragged(rows: int, group: int) -> list[int]:
    """Lengths 1..300: block-aligned, one past a block, and arbitrary."""
    lengths = [1, 16, 17, 300, 31, 64, 129, 2, 250, 48, 5, 200, 33, 99, 160, 7]
    return [37 + 150 * group] if rows == 1 else lengths[:rows]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_kernel_matches_torch_path(
    monkeypatch: pytest.MonkeyPatch, isa: str, rows: int, dtype: torch.dtype, head_dim: int, group: int
) -> None:
    lengths = ragged(rows, group)
    monkeypatch.setenv(kernels.KERNELS_ENV, isa)
    fused = Step(lengths, 2, group, head_dim, dtype)
    assert fused.meta.cpu_kernels is not None and fused.meta.cpu_kernels.name == isa
    monkeypatch.setenv(kernels.KERNELS_ENV, "off")
    plain = Step(lengths, 2, group, head_dim, dtype)
    assert plain.meta.cpu_kernels is None
    assert fused.out.dtype == dtype and fused.out.shape == plain.out.shape
    if dtype == torch.bfloat16:
        torch.testing.assert_close(fused.out.float(), plain.out.float(), atol=1e-6, rtol=2**-6)
        return
    torch.testing.assert_close(fused.out, plain.out, atol=1e-5, rtol=1e-5)
    for row in range(rows):
        torch.testing.assert_close(fused.out[row].double(), fused.reference(row), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    ("window", "softcap"), [(0, 0.0), (5, 0.0), (40, 0.0), (1000, 0.0), (0, 2.0), (24, 1.5)]
)
def test_window_and_softcap(isa: str, window: int, softcap: float) -> None:
    """The C API's options: only the last `window` positions; scores capped to softcap * tanh(s / softcap)."""
    step = Step([300, 7, 64, 33], 2, 4, 64, torch.float32)
    ops = kernels.load(isa)
    assert ops is not None
    tables = torch.from_numpy(step.tables.astype(np.int64))
    lens = torch.tensor(step.lengths, dtype=torch.int64)
    # large scores so that the cap changes the result
    q = step.q * 3
    out = ops.decode_attention(q, step.cache, tables, lens, BLOCK, 64**-0.5, window, softcap)
    for row, n in enumerate(step.lengths):
        expected = dense(q[row], step.cache, step.tables[row], n, window, softcap)
        torch.testing.assert_close(out[row].double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 3, 8])
@pytest.mark.parametrize(("lengths", "window"), [([1000], 0), ([1000], 300), ([700, 130], 0), ([129], 0)])
def test_long_rows_split_across_threads(
    lengths: list[int], window: int, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Too few (row, KV head) pairs for the threads: each pair's positions are split into parts (at
    least 128 positions each) whose partial softmaxes are merged; the result must not depend on it."""
    step = Step(lengths, 2, 3, 64, torch.float32)
    ops = kernels.load()
    assert ops is not None
    tables = torch.from_numpy(step.tables.astype(np.int64))
    lens = torch.tensor(lengths, dtype=torch.int64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = ops.decode_attention(step.q, step.cache, tables, lens, BLOCK, 64**-0.5, window)
    finally:
        torch.set_num_threads(before)
    for row, n in enumerate(lengths):
        expected = dense(step.q[row], step.cache, step.tables[row], n, window)
        torch.testing.assert_close(out[row].double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layers_with_options_take_the_kernel_too(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma-style options (window, soft-cap, own scale) through paged_attention: kernel vs torch."""
    options = AttentionOptions(window=40, softcap=1.5, scale=0.2)
    outs = []
    for choice in ("auto", "off"):
        monkeypatch.setenv(kernels.KERNELS_ENV, choice)
        step = Step([300, 7, 64, 33], 2, 4, 64, dtype)
        assert (step.meta.cpu_kernels is not None) == (choice == "auto")
        slots = step.meta.slot_mapping  # this step's K/V are in the cache already: write the same again
        k, v = step.cache[0][:, slots].transpose(0, 1), step.cache[1][:, slots].transpose(0, 1)
        outs.append(paged_attention(step.q, k, v, step.cache, step.meta, options).float())
    tol = (1e-6, 2**-6) if dtype == torch.bfloat16 else (1e-5, 1e-5)
    torch.testing.assert_close(outs[0], outs[1], atol=tol[0], rtol=tol[1])


def test_torch_attention_setting_forces_the_plain_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALCHAT_TORCH_ATTENTION", "torch")
    assert Step([20, 3], 2, 2, 64, torch.float32).meta.cpu_kernels is None
    monkeypatch.delenv("LOCALCHAT_TORCH_ATTENTION")
    assert Step([20, 3], 2, 2, 64, torch.float32).meta.cpu_kernels is not None


def test_shapes_beyond_the_kernel_keep_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """64 query heads on one KV head (more than the kernel's group buffer): the torch path answers."""
    step = Step([40, 9], 1, 64, 32, torch.float32)
    assert step.meta.cpu_kernels is not None
    assert not kernels.decode_attention_ok(step.q, step.cache)
    for row in range(2):
        torch.testing.assert_close(step.out[row].double(), step.reference(row), atol=1e-5, rtol=1e-5)


def test_a_bad_kernels_value_leaves_steps_on_the_plain_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights loader reports LOCALCHAT_KERNELS typos; a decode step must not fail over one."""
    monkeypatch.setenv(kernels.KERNELS_ENV, "avx9000")
    step = Step([20, 3], 2, 2, 64, torch.float32)
    assert step.meta.cpu_kernels is None
    torch.testing.assert_close(step.out[0].double(), step.reference(0), atol=1e-5, rtol=1e-5)


def test_rejects_block_ids_outside_the_cache() -> None:
    ops = kernels.load("portable")
    assert ops is not None
    cache = torch.zeros(2, 2, 4 * BLOCK, 64)
    q = torch.zeros(1, 4, 64)
    lens = torch.tensor([20], dtype=torch.int64)
    with pytest.raises(BackendUnavailableError, match="decode-attention kernel rejected"):
        ops.decode_attention(q, cache, torch.tensor([[1, 4]]), lens, BLOCK, 0.125)
    # a length beyond the table's width is refused too, not read past the table
    with pytest.raises(BackendUnavailableError):
        ops.decode_attention(q, cache, torch.tensor([[1]]), lens, BLOCK, 0.125)
    assert ops.decode_attention(q, cache, torch.tensor([[1, 3]]), lens, BLOCK, 0.125).abs().sum() == 0


def test_a_model_step_reads_the_setting_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within one step (the runner wraps each in one_step_choice) every layer gets the choice read at
    its start; the next step reads the env again."""
    from localchat.backends.torch import kernel_choice

    cpu = torch.device("cpu")
    monkeypatch.delenv("LOCALCHAT_TORCH_ATTENTION", raising=False)
    with kernel_choice.one_step_choice(cpu):
        monkeypatch.setenv("LOCALCHAT_TORCH_ATTENTION", "torch")
        assert kernel_choice.cpu_decode_kernels(cpu) is not None  # pinned at the step's start
    assert kernel_choice.cpu_decode_kernels(cpu) is None  # outside a step: read per call
    with kernel_choice.one_step_choice(cpu):
        monkeypatch.delenv("LOCALCHAT_TORCH_ATTENTION")
        assert kernel_choice.cpu_decode_kernels(cpu) is None
    assert kernel_choice.cpu_decode_kernels(torch.device("meta")) is None
    # a GPU step never loads the CPU library (nor logs that it is missing)
    monkeypatch.setattr(kernel_choice, "_read_choice", lambda: pytest.fail("read on a GPU step"))
    with kernel_choice.one_step_choice(torch.device("meta")):
        assert kernel_choice.cpu_decode_kernels(cpu) is None


def spy_on_decode_attention(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The query rows of each `Kernels.decode_attention` call from now on, in call order."""
    calls: list[int] = []
    original = kernels.Kernels.decode_attention

    def spy(self: kernels.Kernels, q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(q.shape[0])
        return original(self, q, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kernels.Kernels, "decode_attention", spy)
    return calls


class PrefillStep:
    """One step of prefill rows (one with a cached prefix) and a decode row through paged_attention."""

    ROWS = ((40, 40), (100, 37), (50, 1), (17, 17))  # (context after the step, new tokens)

    def __init__(self, dtype: torch.dtype, cache_dtype: torch.dtype, group: int) -> None:
        kv_heads, head_dim = 2, 64
        blocks = sum(-(-n // BLOCK) for n, _ in self.ROWS) + 3
        batch = make_batch(self.ROWS, BLOCK, blocks, seed=group)
        gen = torch.Generator().manual_seed(group)
        self.cache = torch.randn(2, kv_heads, blocks * BLOCK, head_dim, generator=gen).to(cache_dtype)
        tokens = sum(new for _, new in self.ROWS)
        self.q = torch.randn(tokens, kv_heads * group, head_dim, generator=gen).to(dtype)
        k = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype)
        self.tables, self.positions = batch.block_tables, batch.positions
        self.row_of_token = [row for row, (_, new) in enumerate(self.ROWS) for _ in range(new)]
        self.meta = AttentionMetadata.from_batch(batch, torch.device("cpu"), kv_heads)
        self.out = paged_attention(self.q, k, v, self.cache, self.meta)

    def reference(self, token: int, row: int) -> torch.Tensor:
        """Causal: the query at position p sees positions 0..p of its row's context."""
        return dense(self.q[token], self.cache, self.tables[row], int(self.positions[token]) + 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_prefill_rows_run_on_the_kernel_and_match_the_torch_path(
    dtype: torch.dtype, group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each prefill query is one decode-kernel row over the cache it was just written to (its context
    length = its position + 1), which is causal attention, prefix-cached rows included."""
    calls = spy_on_decode_attention(monkeypatch)
    fused = PrefillStep(dtype, dtype, group)
    assert sorted(calls) == [1, 17, 37, 40]  # the decode row, then each prefill row's queries
    monkeypatch.setenv(kernels.KERNELS_ENV, "off")
    plain = PrefillStep(dtype, dtype, group)
    reference = torch.stack([fused.reference(token, row) for token, row in enumerate(fused.row_of_token)])
    # float32: within float32 summation noise of the float64 reference; bfloat16: within half a
    # bfloat16 step of it (the kernel accumulates in float32 and rounds once), never worse than torch's
    # SDPA, which also rounds its probabilities to bfloat16 (~2e-3 off here)
    tol = (1e-5, 2**-8) if dtype == torch.bfloat16 else (1e-5, 1e-5)
    torch.testing.assert_close(fused.out.double(), reference, atol=tol[0], rtol=tol[1])
    fused_error = (fused.out.double() - reference).abs().max()
    assert fused_error <= (plain.out.double() - reference).abs().max()


def test_prefill_keeps_the_torch_path_where_the_cache_rounds_this_steps_kv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cache in another dtype than the compute (here float32 q, bfloat16 cache) holds rounded k/v;
    the torch prefill path attends over the unrounded ones, so it stays (the decode row still runs on
    the kernel)."""
    calls = spy_on_decode_attention(monkeypatch)
    PrefillStep(torch.float32, torch.bfloat16, 4)
    assert calls == [1]
