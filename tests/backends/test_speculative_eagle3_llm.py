"""`LLM(..., speculative=, draft_model=)` on the real SmolLM2-135M (torch): an EAGLE-3 head folder (random
weights, a 512-token draft vocabulary mapped through d2t, the target's own embedding) and the model as its
own draft both give plain greedy's tokens; a runner that cannot feed a head is refused with a message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from localchat import LLM, SamplingParams
from localchat.config import SettingsError
from localchat.serving.draft_model import eagle_proposer_for

SMOL_HIDDEN, SMOL_VOCAB = 576, 49152
HEADS, KV_HEADS, HEAD_DIM, FFN, DRAFT_VOCAB = 2, 1, 32, 64, 512


def random_eagle_head(
    folder: Path,
    hidden: int,
    vocab: int,
    aux_layers: list[int] | None = None,
    target_hidden: int | None = None,
) -> Path:
    """A random EAGLE-3 head in vLLM's layout over a DRAFT_VOCAB-token draft vocabulary (d2t, t2d), without
    its own embedding; `target_hidden`: the hidden size it claims to read (default: `hidden`)."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return 0.05 * torch.randn(*shape, generator=gen)

    h, th = hidden, target_hidden or hidden
    targets = torch.randperm(vocab, generator=gen)[:DRAFT_VOCAB].sort().values
    tensors = {
        "fc.weight": rand(h, 3 * th),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, HEADS * HEAD_DIM),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.mlp.gate_proj.weight": rand(FFN, h),
        "midlayer.mlp.up_proj.weight": rand(FFN, h),
        "midlayer.mlp.down_proj.weight": rand(h, FFN),
        "norm.weight": torch.ones(h),
        "lm_head.weight": rand(DRAFT_VOCAB, h),
        "d2t": targets - torch.arange(DRAFT_VOCAB),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill(0, targets, True),
    }
    folder.mkdir()
    config: dict[str, object] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": h,
        "intermediate_size": FFN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "draft_vocab_size": DRAFT_VOCAB,
        "target_hidden_size": th,
    }
    if aux_layers is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_layers}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.slow
def test_llm_takes_the_speculative_settings(smollm2_gguf: Path, tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    plain = LLM(smollm2_gguf, backend="torch").chat(messages, params).token_ids
    eagle = LLM(
        smollm2_gguf,
        backend="torch",
        speculative="eagle",
        draft_model=random_eagle_head(tmp_path / "head", SMOL_HIDDEN, SMOL_VOCAB),
    )
    assert eagle.chat(messages, params).token_ids == plain
    stats = eagle.engine.stats()
    assert stats.speculative_method == "eagle" and stats.spec_draft_tokens_total > 0
    drafted = LLM(smollm2_gguf, backend="torch", speculative="draft", draft_model=smollm2_gguf)
    assert drafted.chat(messages, params).token_ids == plain
    assert drafted.engine.spec_accepted_tokens >= 0.9 * drafted.engine.spec_draft_tokens > 0


def test_eagle_needs_a_head_and_a_runner_that_can_feed_it() -> None:
    with pytest.raises(SettingsError, match="needs an EAGLE-3 head: pass --draft-model FOLDER"):
        eagle_proposer_for(None, object(), None, "m")  # type: ignore[arg-type]

    class MlxLikeRunner:
        pass

    with pytest.raises(SettingsError, match="torch backend only: the MlxLikeRunner runner"):
        eagle_proposer_for("/heads/e3", MlxLikeRunner(), None, "m")  # type: ignore[arg-type]
