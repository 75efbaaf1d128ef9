"""Hugging Face folders: config (incl. transformers 5 nested rope), sharded mmapped safetensors, defaults."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localchat.errors import ModelLoadError, UnsupportedArchitectureError
from localchat.weights.loader import load_model
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2}


def _is_mapped(array: np.ndarray) -> bool:
    """True when `array` is a view into a memory-mapped file (no copy was made)."""
    base = array
    while base is not None:
        if isinstance(base, np.memmap):
            return True
        base = base.base
    return False


@pytest.fixture(scope="module")
def hf_tokenizer_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved transformers tokenizer (byte-level BPE, ChatML specials) to drop into model folders."""
    folder = tmp_path_factory.mktemp("tokenizer")
    cfg = tiny_config("llama", hidden_size=32, intermediate_size=64, head_dim=16, num_hidden_layers=1)
    embed = {"model.embed_tokens.weight": random_state_dict(cfg)["model.embed_tokens.weight"]}
    write_tiny_gguf(folder / "t.gguf", embed, cfg, "F32", "gpt2", pre="qwen2")
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file="t.gguf")
    tok.save_pretrained(folder / "saved")
    return folder / "saved"


def _save(model, folder: Path, tokenizer_files: Path, **kwargs) -> Path:
    model.save_pretrained(folder, **kwargs)
    for f in tokenizer_files.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    return folder


def _assert_same_weights(bundle, model) -> None:
    tied = model.config.tie_word_embeddings  # a tied lm_head is not saved: the backend reuses the embedding
    state = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    loaded = {w.name: w for w in bundle.iter_weights()}
    assert set(loaded) == set(state)
    for name, ref in state.items():
        w = loaded[name]
        assert w.shape == tuple(ref.shape) and _is_mapped(w.data), name
        np.testing.assert_array_equal(w.dequantize(), ref.float().numpy(), err_msg=name)


@pytest.mark.parametrize("shard", [None, "60KB"])
def test_llama_folder_loads_identical_tensors(
    tmp_path: Path, hf_tokenizer_files: Path, shard: str | None
) -> None:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, **HEADS, rope_theta=123456.0))
    kwargs = {"max_shard_size": shard} if shard else {}
    folder = _save(model, tmp_path / "tiny-llama", hf_tokenizer_files, **kwargs)
    assert (folder / "model.safetensors.index.json").is_file() == (shard is not None)
    if shard:
        assert len(list(folder.glob("model-*.safetensors"))) > 2
    bundle = load_model(folder)
    assert bundle.format == "safetensors" and bundle.name == "tiny-llama"
    c = bundle.config
    assert (c.model_type, c.hidden_size, c.num_hidden_layers) == ("llama", 64, 2)
    assert (c.num_key_value_heads, c.head_dim) == (2, 16)
    # transformers 5 writes rope_theta only inside the nested rope_parameters object.
    assert "rope_theta" not in json.loads((folder / "config.json").read_text())
    assert c.rope_theta == 123456.0
    _assert_same_weights(bundle, model)


def test_bf16_comes_through_as_a_mapped_uint16_view(tmp_path: Path, hf_tokenizer_files: Path) -> None:
    torch.manual_seed(1)
    config = transformers.Qwen2Config(**SMALL, **HEADS, tie_word_embeddings=True)
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
    bundle = load_model(_save(model, tmp_path / "qwen", hf_tokenizer_files))
    c = bundle.config
    assert c.model_type == "qwen2" and c.attention_bias and c.tie_word_embeddings
    w = next(w for w in bundle.iter_weights() if w.name == "model.layers.0.self_attn.q_proj.bias")
    assert w.dtype == "BF16" and w.data.dtype == np.uint16 and not w.data.flags.writeable
    expected_bits = model.state_dict()[w.name].view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(w.data, expected_bits)
    _assert_same_weights(bundle, model)


def test_generation_config_and_chat_template(tmp_path: Path, hf_tokenizer_files: Path) -> None:
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, **HEADS))
    folder = _save(model, tmp_path / "chat", hf_tokenizer_files)
    generation = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "do_sample": True, "eos_token_id": [2, 0]}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    bundle = load_model(folder, name="my-model")
    assert bundle.name == "my-model"
    assert bundle.generation_defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    assert bundle.config.eos_token_ids == [2, 0]
    assert bundle.chat_template == "D"
    assert bundle.tokenizer.eos_token_ids[:2] == [2, 0]


def test_chat_template_jinja_file_and_end_of_turn_eos(tmp_path: Path, hf_tokenizer_files: Path) -> None:
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, **HEADS, eos_token_id=0))
    folder = _save(model, tmp_path / "jinja", hf_tokenizer_files)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").unlink()
    (folder / "chat_template.jinja").write_text("{{ '<|im_start|>' }}{{ m }}{{ '<|im_end|>' }}")
    bundle = load_model(folder)
    assert bundle.chat_template.startswith("{{ '<|im_start|>' }}")
    assert bundle.generation_defaults == {}
    assert bundle.config.eos_token_ids == [0, 2]  # config.json's EOS, then the template's <|im_end|>


def test_processor_chat_template_json(tmp_path: Path, hf_tokenizer_files: Path) -> None:
    """Multimodal repos (Gemma 3, Mistral 3) may keep the template only in chat_template.json."""
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, **HEADS))
    folder = _save(model, tmp_path / "processor", hf_tokenizer_files)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}"}))
    assert load_model(folder).chat_template == "{{ messages[0]['content'] }}"
    (folder / "chat_template.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match=r"chat_template\.json"):
        load_model(folder)


def test_unsupported_architecture_in_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "rwkv6", "hidden_size": 8}))
    with pytest.raises(UnsupportedArchitectureError, match="rwkv6"):
        load_model(tmp_path)


def test_missing_weights_and_shards(tmp_path: Path, hf_tokenizer_files: Path) -> None:
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, **HEADS))
    folder = _save(model, tmp_path / "m", hf_tokenizer_files, max_shard_size="60KB")
    next(folder.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(ModelLoadError, match="incomplete"):
        load_model(folder)
    for f in folder.glob("model*"):
        f.unlink()
    with pytest.raises(ModelLoadError, match=r"no model\.safetensors"):
        load_model(folder)


def test_quantized_safetensors_are_refused(tmp_path: Path, hf_tokenizer_files: Path) -> None:
    from safetensors.numpy import save_file

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, **HEADS))
    folder = _save(model, tmp_path / "q", hf_tokenizer_files)
    save_file(
        {"model.embed_tokens.weight": np.zeros((4, 4), dtype=np.int8)}, str(folder / "model.safetensors")
    )
    with pytest.raises(ModelLoadError, match="dtype I8"):
        load_model(folder)


def test_folder_without_tokenizer_json(tmp_path: Path) -> None:
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, **HEADS))
    model.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json"):
        load_model(tmp_path)
