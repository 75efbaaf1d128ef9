"""`--tp 2` on GGUF files of the Mamba-2 and DeltaNet families (Qwen3.5 `qwen35`, Qwen3-Next
`qwen3next`, Qwen3.5-MoE `qwen35moe`, Nemotron-H, Granite 4.0-H), written by llama.cpp's own converter from tiny random
transformers models (tests/backends/test_hybrid_gguf.py's): greedy tokens equal one device on the same
file and float32 logits within 1e-4, ragged, chunked (a 70-token prompt: two scan chunks) and preempted.

The family's GGUF sanitize (A stored as -exp(A_log), norms as 1 + w, the conv squeezed, qwen35's value
heads tiled, Granite's gate and up split) runs once, on the whole model, before the cut; the rank's
config then says its tensors are in the checkpoint's form, so the load does not convert them again.
The Q8_0 recurrent projections stay Q8_0 blocks on every rank."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from localchat.backends.torch.parallel.group import ParallelGroup
from localchat.backends.torch.parallel.shard_weights import RankSlice, shard_weights
from localchat.weights.bundle import ModelBundle
from localchat.weights.loader import load_model
from tests.backends import test_hybrid_gguf as gguf
from tests.helpers.tp_parity import TP2, TP2_PP2, assert_tp_parity

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # runs llama.cpp's converter, then spawns gloo ranks

# Qwen3.5 with value heads narrower than a Q8_0 block (16 of 32): one device keeps ssm_out's tiled
# columns in their blocks and moves the activations (weights/ordered_blocks.py); 4 key heads so that a
# rank's 2 make whole blocks in the tiled order too.
NARROW = dict(
    linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=16, linear_value_head_dim=16
)


def tiny_qwen3_5_narrow() -> torch.nn.Module:
    torch.manual_seed(0)
    config = gguf.transformers.Qwen3_5TextConfig(**{**gguf._qwen3_5_sizes(), **NARROW})
    return gguf._randomized(gguf.transformers.Qwen3_5ForCausalLM(config), keep=("A_log", "dt_bias"))


FAMILIES = {
    **{k: gguf.FAMILIES[k] for k in ("qwen35", "qwen3next", "qwen35moe", "nemotron_h", "granitehybrid")}
}
FAMILIES["qwen35-narrow"] = (tiny_qwen3_5_narrow, *gguf.FAMILIES["qwen35"][1:])


def _q8_0_file(family: str, tmp: Path) -> Path:
    build, _, hub_config, flags = FAMILIES[family]
    folder = gguf._save_with_tokenizer(build(), tmp / "hf")
    config_file = folder / "config.json"
    config_file.write_text(json.dumps(hub_config(json.loads(config_file.read_text()))))
    return gguf._convert(folder, tmp / "q8_0.gguf", "q8_0", *flags)


@pytest.fixture(scope="module", params=list(FAMILIES))
def q8_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _q8_0_file(request.param, tmp_path_factory.mktemp(request.param))


def _load(path: str) -> ModelBundle:
    """The workers' loader: the file itself, through the real GGUF loader."""
    return load_model(Path(path))


def _recurrent_leaf(name: str) -> bool:
    return any(f"{m}.{p}" in name for m in ("linear_attn", "mamba", "mixer") for p in ("in_proj", "out_proj"))


def test_the_recurrent_projections_stay_q8_0_blocks_on_each_rank(q8_file: Path) -> None:
    """The rank's rows of in_proj and its columns of out_proj are whole Q8_0 blocks: no float copy."""
    bundle = load_model(q8_file)
    config = bundle.config
    for rank in (0, 1):
        part = RankSlice.of(config, ParallelGroup(rank, 2))
        cut = [w for w in shard_weights(bundle.iter_weights(), config, part) if _recurrent_leaf(w.name)]
        assert cut and all(w.dtype in ("Q8_0", "GGUF_ORDERED") for w in cut), {w.name: w.dtype for w in cut}
        local = part.local_config(config)
        assert not local.extra["gguf_ssm_inner_size"]  # the rank's tensors: the checkpoint's form


def test_tp2_on_a_hybrid_gguf_matches_one_device(q8_file: Path) -> None:
    assert_tp_parity(functools.partial(_load, str(q8_file)), TP2)


def test_tp2_by_pp2_on_a_qwen35_gguf_matches_one_device(tmp_path: Path) -> None:
    """Each stage's two ranks cut its layers of the file: stage 0 holds DeltaNet layers only."""
    path = _q8_0_file("qwen35", tmp_path)
    assert_tp_parity(functools.partial(_load, str(path)), TP2_PP2)
