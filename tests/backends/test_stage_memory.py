"""The per-stage memory estimate (`--pp`, `--gpu-layers`: checked on each CUDA stage before loading)
counts what the stage's own layers keep: K/V per token for its K/V layers only, and, in hybrid models,
one sequence's recurrent state for its state layers (DeltaNet, Mamba-2, short conv), a fixed size per
sequence however long. A stage too small for its state is told so, and what to change."""

from __future__ import annotations

from dataclasses import replace

import pytest

from localchat.arch.qwen3_next import state_bytes_per_sequence
from localchat.arch.ssm import mamba2_state_bytes
from localchat.backends.torch.parallel.memory import (
    HEADROOM,
    KV_ELEMENT_BYTES,
    MIN_KV_TOKENS,
    check_stage_bytes,
    stage_bytes,
)
from localchat.errors import BackendUnavailableError
from localchat.weights.config import ModelConfig
from tests.backends.test_pipeline_hybrid import hybrid_bundle

GIB = 2**30
FLAG = "--pipeline-parallel-size 2"


def qwen3_5(value_head_dim: int = 128) -> ModelConfig:
    """The tiny Qwen3.5 ([linear x3, full]) with Qwen3-Next-sized DeltaNet heads: 2 MiB of float32
    recurrent state per layer and sequence at value head dim 128."""
    config = hybrid_bundle("qwen3_5").config
    extra = {
        **config.extra,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": value_head_dim,
    }
    return replace(config, extra=extra)


def test_state_is_counted_on_the_stage_that_holds_its_layers() -> None:
    config = qwen3_5()
    linear, full = (
        stage_bytes(config, range(0, 3), True, False, GIB),
        stage_bytes(config, range(3, 4), False, True, GIB),
    )
    assert linear.state_per_slot == state_bytes_per_sequence(
        config, KV_ELEMENT_BYTES
    )  # all 3 DeltaNet layers
    assert linear.kv_per_token == 0  # no K/V layer on stage 0
    assert full.state_per_slot == 0 and full.kv_per_token > 0
    # A wider state: the estimate grows with it (recurrent [heads, dk, dv] float32, conv window of q|k|v).
    wider = stage_bytes(qwen3_5(256), range(0, 3), True, False, GIB)
    recurrent = 3 * 32 * 128 * 128 * 4
    assert wider.state_per_slot - linear.state_per_slot == recurrent + 3 * 32 * 128 * 3 * KV_ELEMENT_BYTES
    assert wider.need() - linear.need() == wider.state_per_slot - linear.state_per_slot


def test_mamba_state_splits_with_the_layers() -> None:
    """Nemotron-H [mamba, mlp, attention, mlp, mamba, mlp]: one Mamba-2 layer per stage, half the state
    each; the attention layer's K/V on stage 0 only."""
    config = hybrid_bundle("nemotron_h").config
    first = stage_bytes(config, range(0, 3), True, False, GIB)
    last = stage_bytes(config, range(3, 6), False, True, GIB)
    assert first.state_per_slot == last.state_per_slot == mamba2_state_bytes(config, KV_ELEMENT_BYTES) // 2
    assert first.kv_per_token > 0 and last.kv_per_token == 0


def test_a_stage_too_small_for_its_state_says_what_to_change() -> None:
    config = qwen3_5()
    size = stage_bytes(config, range(0, 3), True, False, GIB)
    without_state = int(size.weights * HEADROOM + size.kv_per_token * MIN_KV_TOKENS)
    assert size.need() > without_state
    check_stage_bytes(config, 0, range(0, 3), False, "cuda:0", FLAG, GIB, size.need())
    message = (
        r"--pipeline-parallel-size 2: stage 0 \(layers 0-2\) needs about .* GiB \(.* GiB of weights \+ K/V "
        r"for 2048 tokens \+ 6\.1 MiB of recurrent state for 1 sequence in its 3 state layers\) but cuda:0 has "
        r".* GiB free\. Use more stages \(a larger --pipeline-parallel-size\), fewer --gpu-layers, a "
        r"smaller quantization"
    )
    with pytest.raises(BackendUnavailableError, match=message):
        check_stage_bytes(config, 0, range(0, 3), False, "cuda:0", FLAG, GIB, size.need() - 1)


def test_gemma4_kv_sharing_layers_keep_no_kv_of_their_own() -> None:
    """E2B's layout: the last stage of --pp 2 (layers 13-34) writes K/V for layers 13 and 14 only."""
    from tests.backends.test_pipeline_gemma4_ple import _config

    config = _config(35, 20, 5)
    last = stage_bytes(config, range(13, 35), False, True, GIB)
    assert last.kv_per_token == 2 * 2 * config.num_key_value_heads * config.head_dim * KV_ELEMENT_BYTES
    assert last.state_per_slot == 0
