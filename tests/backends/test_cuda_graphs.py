"""Decode graphs without a GPU: the bucket and padding logic in plain numpy, and the whole CUDA decode
path (Triton kernels under the interpreter + persistent, padded graph buffers replayed eagerly) through
the engine, token-identical to the CPU path."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton decorates the kernels

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from localchat.backends import RunnerOptions, create_runner  # noqa: E402
from localchat.backends.fake import FakeTokenizer  # noqa: E402
from localchat.backends.torch.cuda.cuda_graphs import (  # noqa: E402
    DecodeBuffers,
    graph_buckets,
    is_graphable,
    pad_decode_batch,
    pick_bucket,
)
from localchat.engine.config import EngineConfig  # noqa: E402
from localchat.engine.engine import LLMEngine  # noqa: E402
from tests.helpers.paged_batches import make_batch  # noqa: E402


def test_buckets_double_up_to_max_num_seqs() -> None:
    assert graph_buckets(32) == [1, 2, 4, 8, 16, 32]
    assert graph_buckets(12) == [1, 2, 4, 8, 12]
    assert graph_buckets(1) == [1]
    buckets = graph_buckets(48)
    assert [pick_bucket(n, buckets) for n in (1, 3, 16, 17, 48)] == [1, 4, 16, 32, 48]
    assert pick_bucket(49, buckets) is None  # larger than every graph: eager


def test_padding_rows_write_the_null_block_and_attend_one_key() -> None:
    batch = make_batch([(9, 1), (20, 1), (3, 1)], block_size=4, num_blocks=12)
    padded = pad_decode_batch(batch, bucket=4, max_blocks=8)
    assert padded.input_ids.shape == (4,) and padded.block_tables.shape == (4, 8)
    np.testing.assert_array_equal(padded.slot_mapping[:3], batch.slot_mapping)
    np.testing.assert_array_equal(padded.seq_lens, [9, 20, 3, 1])
    assert padded.slot_mapping[3] == 0 and not padded.block_tables[3].any()  # the null block only
    np.testing.assert_array_equal(padded.block_tables[:3, : batch.block_tables.shape[1]], batch.block_tables)
    assert not padded.block_tables[:, batch.block_tables.shape[1] :].any()


def test_only_decode_steps_that_sample_every_row_are_graphable() -> None:
    assert is_graphable(make_batch([(9, 1), (20, 1)], block_size=4, num_blocks=12))
    assert not is_graphable(make_batch([(9, 1), (20, 5)], block_size=4, num_blocks=12))


def test_buffers_are_reused_in_place() -> None:
    buffers = DecodeBuffers(max_rows=8, max_blocks=8, block_size=4, device=torch.device("cpu"))
    addresses = [t.data_ptr() for t in (buffers.input_ids, buffers.block_tables, buffers.seq_lens)]
    first = make_batch([(9, 1), (20, 1)], block_size=4, num_blocks=12, seed=1)
    second = make_batch([(5, 1)], block_size=4, num_blocks=12, seed=2)
    buffers.load(pad_decode_batch(first, 2, 8))
    buffers.load(pad_decode_batch(second, 1, 8))
    assert [t.data_ptr() for t in (buffers.input_ids, buffers.block_tables, buffers.seq_lens)] == addresses
    assert buffers.seq_lens[:2].tolist() == [5, 20]  # bucket 1 rewrote row 0 only
    meta = buffers.metadata(bucket=2, kv_heads=2, max_seq_len=32, num_sms=132)
    assert meta.block_tables.data_ptr() == buffers.block_tables.data_ptr()  # views, not copies


def _engine(bundle, monkeypatch: pytest.MonkeyPatch, attention: str, graphs: bool) -> LLMEngine:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LOCALCHAT_TORCH_ATTENTION", attention)
    runner = create_runner("torch", bundle, RunnerOptions(device="cpu", dtype="float32", cuda_graphs=graphs))
    config = EngineConfig(kv_cache_mib=1, max_num_seqs=4, max_num_batched_tokens=128, prefill_chunk_size=16)
    return LLMEngine(runner, FakeTokenizer(), config, eos_token_ids=[2], model_max_len=256)  # type: ignore[arg-type]


@pytest.mark.slow
# ministral3: a per-token q scale in the graph; gemma2/gemma3: soft-caps, windows and scales in the graph
@pytest.mark.parametrize("variant", ["llama", "ministral3", "gemma2", "gemma3"])
def test_triton_decode_graph_path_matches_cpu_path_through_the_engine(
    monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton's interpreter, set before import")
    from tests.backends.test_runner_invariance import generate
    from tests.helpers.torch_models import VARIANTS, bundle_from_hf, tiny_hf_model

    model_type, overrides = VARIANTS[variant]
    bundle = bundle_from_hf(tiny_hf_model(model_type, **overrides))
    # Ragged prompts: one longer than a prefill chunk (chunked), two sharing a prefix (cache hits).
    prompts = [[5 + i for i in range(21)], [7, 8, 9], [5 + i for i in range(18)] + [200], [40] * 6]
    expected = generate(_engine(bundle, monkeypatch, "torch", graphs=False), prompts, max_tokens=6)
    engine = _engine(bundle, monkeypatch, "triton", graphs=True)
    assert generate(engine, prompts, max_tokens=6) == expected
    graphs = engine.runner.graphs  # type: ignore[attr-defined]
    assert graphs is not None and graphs.steps_run > 0 and graphs.buckets == [1, 2, 4]


@pytest.mark.slow
def test_moe_models_decode_without_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Expert dispatch sizes its groups on the host, which a captured graph cannot: MoE models run the
    Triton path eagerly, with the same tokens."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton's interpreter, set before import")
    from tests.backends.test_runner_invariance import generate
    from tests.helpers.torch_models import bundle_from_hf, tiny_hf_model

    bundle = bundle_from_hf(tiny_hf_model("mixtral", num_local_experts=4, num_experts_per_tok=2))
    prompts = [[5 + i for i in range(21)], [7, 8, 9]]
    expected = generate(_engine(bundle, monkeypatch, "torch", graphs=False), prompts, max_tokens=4)
    engine = _engine(bundle, monkeypatch, "triton", graphs=True)
    assert engine.runner.graph_mode is None  # type: ignore[attr-defined]
    assert generate(engine, prompts, max_tokens=4) == expected
    assert engine.runner.graphs is None  # type: ignore[attr-defined]
