"""GGUF loading: metadata -> config, llama.cpp tensor names -> HF names, q/k un-permute, quant blocks."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from localchat.errors import ModelLoadError, UnsupportedArchitectureError
from localchat.weights.bundle import ModelBundle
from localchat.weights.gguf import open_gguf
from localchat.weights.loader import load_model
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

# Relative RMS error of a dequantized N(0, 0.02) tensor; measured values are ~2/3 of these bounds.
QUANT_ERROR = {
    "F16": 1e-3,
    "BF16": 6e-3,
    "Q8_0": 0.01,
    "Q6_K": 0.03,
    "Q5_0": 0.06,
    "Q5_1": 0.06,
    "Q5_K": 0.06,
    "Q4_0": 0.12,
    "Q4_1": 0.12,
    "Q4_K": 0.12,
}


@pytest.fixture(scope="module")
def llama_cfg() -> dict:
    return tiny_config("llama")


@pytest.fixture(scope="module")
def llama_weights(llama_cfg: dict) -> dict[str, np.ndarray]:
    return random_state_dict(llama_cfg, seed=1)


@pytest.fixture(scope="module")
def llama_f32(tmp_path_factory: pytest.TempPathFactory, llama_cfg: dict, llama_weights: dict) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf", llama_weights, llama_cfg, "F32")


def _loaded(path: Path) -> dict:
    return {w.name: w for w in load_model(path).iter_weights()}


def test_config_comes_from_metadata(llama_f32: Path, llama_cfg: dict) -> None:
    bundle = load_model(llama_f32)
    c = bundle.config
    assert (c.model_type, c.vocab_size, c.hidden_size, c.intermediate_size) == ("llama", 512, 256, 512)
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (2, 4, 2, 64)
    assert c.rms_norm_eps == 1e-5 and c.rope_theta == 10000.0 and c.max_position_embeddings == 1024
    assert c.rope_scaling is None and not c.tie_word_embeddings and not c.attention_bias
    assert bundle.format == "gguf" and bundle.name == "tiny-f32" and bundle.path == llama_f32
    assert bundle.chat_template is not None and "<|im_start|>" in bundle.chat_template


def test_tensor_names_shapes_and_exact_f32_values(llama_f32: Path, llama_weights: dict) -> None:
    loaded = _loaded(llama_f32)
    assert set(loaded) == set(llama_weights)
    for name, ref in llama_weights.items():
        w = loaded[name]
        assert w.shape == ref.shape and w.dtype == "F32" and not w.is_quantized, name
        # q/k come back un-permuted: the exact HF rows, not llama.cpp's interleaved order.
        np.testing.assert_array_equal(w.dequantize(), ref, err_msg=name)


def test_loader_unpermutes_what_the_converter_permuted(llama_f32: Path, llama_weights: dict) -> None:
    reader = open_gguf(llama_f32)
    raw_q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight").data
    hf_q = llama_weights["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(raw_q, hf_q)  # the file really holds the interleaved layout
    # Head 0, rope pair i: the file's rows 2i and 2i+1 are HF rows i and i + head_dim/2.
    np.testing.assert_array_equal(raw_q[2 * 5], hf_q[5])
    np.testing.assert_array_equal(raw_q[2 * 5 + 1], hf_q[5 + 32])


@pytest.mark.parametrize("qtype", list(QUANT_ERROR))
def test_each_type_dequantizes_within_its_error(
    tmp_path: Path, llama_cfg: dict, llama_weights: dict, qtype: str
) -> None:
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", llama_weights, llama_cfg, qtype)
    for name, w in _loaded(path).items():
        ref = llama_weights[name]
        if ref.ndim == 1:
            assert w.dtype == "F32"  # norms stay F32, as llama.cpp keeps them
            continue
        assert w.dtype == qtype and w.shape == ref.shape
        if w.is_quantized:  # raw blocks, one row of blocks per output feature
            from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

            block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
            assert w.data.dtype == np.uint8 and w.data.shape == (ref.shape[0], ref.shape[1] // block * nbytes)
        got = w.dequantize()
        rel = np.sqrt(np.mean((got - ref) ** 2)) / np.sqrt(np.mean(ref**2))
        assert rel < QUANT_ERROR[qtype], f"{name}: relative error {rel:.4f}"


def test_bf16_is_a_uint16_view_of_the_file(tmp_path: Path, llama_cfg: dict, llama_weights: dict) -> None:
    path = write_tiny_gguf(tmp_path / "tiny-bf16.gguf", llama_weights, llama_cfg, "BF16")
    w = _loaded(path)["model.layers.0.mlp.up_proj.weight"]
    assert w.dtype == "BF16" and w.data.dtype == np.uint16 and w.data.shape == w.shape
    assert not w.data.flags.owndata and not w.data.flags.writeable  # a view into the read-only mmap


def test_tied_embeddings_when_there_is_no_output_tensor(tmp_path: Path) -> None:
    cfg = tiny_config("llama", tie_word_embeddings=True)
    path = write_tiny_gguf(tmp_path / "tied.gguf", random_state_dict(cfg), cfg, "Q8_0")
    bundle = load_model(path)
    assert bundle.config.tie_word_embeddings
    assert "lm_head.weight" not in {w.name for w in bundle.iter_weights()}


def test_qwen2_keeps_row_order_and_biases(tmp_path: Path) -> None:
    cfg = tiny_config("qwen2", rope_theta=1_000_000.0)
    weights = random_state_dict(cfg, seed=2)
    loaded = _loaded(write_tiny_gguf(tmp_path / "qwen2.gguf", weights, cfg, "F32"))
    bundle = load_model(tmp_path / "qwen2.gguf")
    assert bundle.config.model_type == "qwen2" and bundle.config.attention_bias
    assert bundle.config.rope_theta == 1_000_000.0
    assert set(loaded) == set(weights)
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.bias"):
        np.testing.assert_array_equal(loaded[name].dequantize(), weights[name])


def test_qwen3_qk_norms(tmp_path: Path) -> None:
    cfg = tiny_config("qwen3")
    weights = random_state_dict(cfg, seed=3)
    loaded = _loaded(write_tiny_gguf(tmp_path / "qwen3.gguf", weights, cfg, "Q8_0"))
    assert set(loaded) == set(weights)
    np.testing.assert_array_equal(
        loaded["model.layers.0.self_attn.k_norm.weight"].data,
        weights["model.layers.0.self_attn.k_norm.weight"],
    )


def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tmp_path: Path) -> None:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    cfg = tiny_config(
        "llama", head_dim=128, num_attention_heads=2, num_key_value_heads=1, rope_theta=500000.0
    )
    cfg["rope_scaling"] = scaling
    bundle = load_model(write_tiny_gguf(tmp_path / "l31.gguf", random_state_dict(cfg), cfg, "F32"))
    assert bundle.config.rope_scaling == scaling
    assert bundle.config.rope_theta == 500000.0 and bundle.config.head_dim == 128
    assert all(w.name != "rope_freqs.weight" for w in bundle.iter_weights())


@pytest.mark.parametrize(
    ("theta", "head_dim", "factor", "low", "high", "context"),
    [
        (500000.0, 64, 32.0, 1.0, 4.0, 8192),
        (10000.0, 16, 4.0, 1.0, 2.0, 256),
        (10000.0, 16, 32.0, 1.0, 4.0, 8192),
    ],
)
def test_rope_factors_round_trip_with_few_blend_points(
    theta: float, head_dim: int, factor: float, low: float, high: float, context: int
) -> None:
    """Small head_dims leave 0-1 frequencies in the blend; any parameters reproducing the factors do."""
    from localchat.weights.gguf_rope import llama3_multipliers, llama3_scaling_from_factors

    params = {"factor": factor, "low_freq_factor": low, "high_freq_factor": high}
    params["original_max_position_embeddings"] = context
    stored = llama3_multipliers(params, theta, head_dim).astype(np.float32)
    recovered = llama3_scaling_from_factors(stored, theta, head_dim)
    assert recovered is not None and recovered["rope_type"] == "llama3" and recovered["factor"] == factor
    np.testing.assert_allclose(llama3_multipliers(recovered, theta, head_dim), stored, rtol=1e-3)
    with pytest.raises(ModelLoadError, match="rope_freqs"):
        llama3_scaling_from_factors(stored[::-1].copy(), theta, head_dim)  # not Llama 3-shaped


def test_end_of_turn_token_of_the_template_is_eos(tmp_path: Path, llama_cfg: dict) -> None:
    # The SentencePiece vocabulary's EOS is </s>; its ChatML template ends turns with <|im_end|>.
    path = write_tiny_gguf(tmp_path / "spm.gguf", random_state_dict(llama_cfg), llama_cfg, "F32", "llama")
    bundle = load_model(path)
    tok = bundle.tokenizer
    expected = [tok.token_to_id("</s>"), tok.token_to_id("<|im_end|>")]
    assert bundle.config.eos_token_ids == expected and tok.eos_token_ids == expected


def test_unsupported_architecture(tmp_path: Path, llama_cfg: dict) -> None:
    path = write_tiny_gguf(tmp_path / "g.gguf", {}, llama_cfg, "F32", architecture="rwkv6")
    with pytest.raises(UnsupportedArchitectureError) as info:
        load_model(path)
    assert "rwkv6" in str(info.value) and "qwen2" in str(info.value)
    assert info.value.code == "unsupported_architecture"


def test_missing_and_non_model_paths(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope.gguf")
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"this is not gguf" * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(fake)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ModelLoadError, match="Expected a Hugging Face model folder"):
        load_model(text)
    with pytest.raises(ModelLoadError, match=r"without config\.json"):
        load_model(tmp_path)


def test_weights_only_file_is_refused(tmp_path: Path, llama_cfg: dict) -> None:
    path = write_tiny_gguf(tmp_path / "empty.gguf", {}, llama_cfg, "F32")
    with pytest.raises(ModelLoadError, match="token_embd"):
        load_model(path)


def test_transformers_reads_the_helper_files_as_the_original_model(tmp_path: Path) -> None:
    """The helper permutes q/k the converter's way: transformers' own GGUF loader gets the HF weights back."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    small = tiny_config("llama", hidden_size=64, intermediate_size=128, head_dim=16)
    cfg = transformers.LlamaConfig(**{k: v for k, v in small.items() if k != "model_type"})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    write_tiny_gguf(tmp_path / "t.gguf", model, qtype="F32")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="t.gguf")
    for name, ref in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], ref), name


# The real model: SmolLM2-135M-Instruct Q4_1 (llama architecture, Q8_0 embeddings, tied).


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> ModelBundle:
    return load_model(smollm2_gguf)


def test_smollm2_config(smollm2: ModelBundle) -> None:
    bundle = smollm2
    c = bundle.config
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.intermediate_size) == ("llama", 30, 576, 1536)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert c.rope_theta == 100000.0 and c.vocab_size == 49152 and c.tie_word_embeddings
    assert c.rms_norm_eps == 1e-5 and c.max_position_embeddings == 8192
    assert c.bos_token_id == 1 and c.eos_token_ids == [2]  # <|im_end|>, also the template's end of turn
    assert bundle.name == "SmolLM2-135M-Instruct.Q4_1" and bundle.chat_template.startswith("{% for message")


def test_smollm2_tensors_match_transformers_unpermute(smollm2: ModelBundle, smollm2_gguf: Path) -> None:
    """On real Q4_1 rows: our un-permuted q/k equal transformers' own reverse permutation of the file."""
    utils = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    reference = utils.LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    raw = {t.name: t for t in open_gguf(smollm2_gguf).tensors}
    checked = 0
    for w in smollm2.iter_weights():
        assert w.dtype in ("F32", "Q4_1", "Q8_0"), w.name
        layer = w.name.split(".")[2] if w.name.startswith("model.layers.") else None
        if layer in ("0", "29") and w.name.endswith(("q_proj.weight", "k_proj.weight")):
            gguf_name = f"blk.{layer}.attn_{w.name.split('.')[-2][0]}.weight"
            t = raw[gguf_name]
            values = dequantize(t.data, GGMLQuantizationType(t.tensor_type)).reshape(w.shape)
            expected = reference.process(values, gguf_name).weights
            np.testing.assert_array_equal(w.dequantize(), expected, err_msg=w.name)
            checked += 1
    assert checked == 4


@pytest.mark.slow
def test_smollm2_all_weights_equal_transformers_gguf_load(smollm2: ModelBundle, smollm2_gguf: Path) -> None:
    """Every dequantized tensor equals what transformers loads from the same file (~30 s)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name
    )
    state = model.state_dict()
    for w in smollm2.iter_weights():
        np.testing.assert_array_equal(w.dequantize(), state[w.name].float().numpy(), err_msg=w.name)


_MAPPING = re.compile(r"[0-9a-f]+-[0-9a-f]+ ")  # an smaps header line: address range, perms, ..., path


def _resident_mib(path: Path) -> float:
    """This process's resident pages of `path`'s mappings (Linux smaps)."""
    total_kib, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if _MAPPING.match(line):
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total_kib += int(line.split()[1])
    return total_kib / 1024


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps")
def test_read_weights_leave_the_resident_set(smollm2_gguf: Path, tmp_path: Path) -> None:
    """A load holds one tensor's file pages at a time, not the whole file on top of the converted
    weights; views handed out earlier still read the right bytes (the pages fault back in)."""
    path = tmp_path / "model.gguf"  # a private copy: other tests in this process map the shared file
    path.write_bytes(smollm2_gguf.read_bytes())
    bundle = load_model(path)
    kept, sums = [], []
    for w in bundle.iter_weights():
        sums.append(int(np.asarray(w.data).view(np.uint8).sum(dtype=np.uint64)))  # touches every page
        kept.append(w)
    assert path.stat().st_size > 90 * 2**20
    assert _resident_mib(path) < 16, "the file's weight pages are still resident after the load"
    assert [int(np.asarray(w.data).view(np.uint8).sum(dtype=np.uint64)) for w in kept] == sums
