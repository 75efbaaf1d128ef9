"""The torch runner against transformers on tiny random models, fp32 on CPU: logits within 1e-4 and
greedy tokens identical, through every shape of step the engine produces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import UnsupportedArchitectureError
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import VARIANTS, bundle_from_hf, fp32_runner, tiny_hf_model

ATOL = 1e-4
PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64]
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, TorchRunner]:
    model_type, overrides = VARIANTS[request.param]
    hf = tiny_hf_model(model_type, **overrides)
    return hf, fp32_runner(bundle_from_hf(hf))


def hf_logits(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """[len(tokens), vocab]: the reference logits at every position."""
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def hf_generate(hf: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, attention_mask=None)
    return out[0, len(prompt) :].tolist()


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    ours = ours.cpu()  # the runner may be on CUDA (LOCALCHAT_TEST_DEVICE), the reference is on the CPU
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < ATOL


def test_prompt_and_greedy_decode_logits(pair: tuple[torch.nn.Module, TorchRunner]) -> None:
    hf, runner = pair
    driver = PagedDriver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT))
    for _ in range(8):
        driver.feed("a", int(logits[-1].argmax()))
        _, logits = driver.step_logits()
        assert_close(logits[0], hf_logits(hf, driver.tokens("a"))[-1])


def test_batch_of_different_lengths(pair: tuple[torch.nn.Module, TorchRunner]) -> None:
    hf, runner = pair
    driver = PagedDriver(runner)
    prompts = {"a": PROMPT[:3], "b": PROMPT * 3, "c": PROMPT[::-1]}
    for req_id, prompt in prompts.items():
        driver.add(req_id, prompt)
    for _ in range(3):  # one prefill step for all, then decode steps for all
        ids, logits = driver.step_logits()
        for row, req_id in enumerate(ids):
            assert_close(logits[row], hf_logits(hf, driver.tokens(req_id))[-1])
            driver.feed(req_id, int(logits[row].argmax()))


def test_prefill_over_cached_prefix(pair: tuple[torch.nn.Module, TorchRunner]) -> None:
    hf, runner = pair
    driver = PagedDriver(runner, block_size=4)
    first = [*PROMPT, 11, 12, 13, 14, 15]  # 16 tokens: four full blocks
    driver.add("a", first)
    driver.step()
    # b reuses a's first 12 tokens from the cache (3 blocks) and computes only its own suffix.
    second = [*first[:12], 200, 201, 202]
    driver.add("b", second, share_prefix_with="a", num_cached=12)
    _, logits = driver.step_logits({"b": 3}, every_token=True)
    assert_close(logits, hf_logits(hf, second)[12:])


def test_chunked_prefill(pair: tuple[torch.nn.Module, TorchRunner]) -> None:
    hf, runner = pair
    driver = PagedDriver(runner, block_size=4)
    prompt = PROMPT * 2  # 22 tokens in chunks of 7, 6 (a middle chunk, not block aligned), 9
    driver.add("a", prompt)
    ref = hf_logits(hf, prompt)
    done = 0
    for chunk in (7, 6, 9):
        _, logits = driver.step_logits({"a": chunk}, every_token=True)
        assert_close(logits, ref[done : done + chunk])
        done += chunk


def test_mixed_prefill_and_decode(pair: tuple[torch.nn.Module, TorchRunner]) -> None:
    hf, runner = pair
    driver = PagedDriver(runner, block_size=4)
    driver.add("dec", PROMPT)
    driver.add("chunked", PROMPT * 2)
    driver.step({"dec": len(PROMPT), "chunked": 5})
    driver.add("new", PROMPT[2:9])
    # decode row + middle prefill chunk + fresh full prefill in one step
    ids, logits = driver.step_logits({"dec": 1, "chunked": 8, "new": 7}, every_token=True)
    ref = {
        "dec": hf_logits(hf, driver.tokens("dec"))[-1:],
        "chunked": hf_logits(hf, PROMPT * 2)[5:13],
        "new": hf_logits(hf, PROMPT[2:9]),
    }
    for req_id, expected in ref.items():
        rows = [i for i, r in enumerate(ids) if r == req_id]
        assert_close(logits[rows], expected)


def test_greedy_generation_matches_generate(pair: tuple[torch.nn.Module, TorchRunner]) -> None:
    """Three requests arriving at different steps, decoded together, preempted and resumed."""
    hf, runner = pair
    prompts = {"a": PROMPT, "b": PROMPT[4:], "c": [9, 8, 7, 6, 5, 4, 3, 2]}
    n = 12
    expected = {r: hf_generate(hf, p, n) for r, p in prompts.items()}
    driver = PagedDriver(runner)
    driver.add("a", prompts["a"], GREEDY)
    driver.step()
    driver.add("b", prompts["b"], GREEDY)
    for step in range(n + 3):
        if step == 2:
            driver.add("c", prompts["c"], GREEDY)
        if step == 5:
            driver.preempt("b")  # comes back with its output tokens as part of the recomputed prefix
        todo = {r: len(q.tokens) - q.num_computed for r, q in driver.reqs.items()}
        todo = {r: k for r, k in todo.items() if len(driver.tokens(r)) - len(prompts[r]) < n}
        if not todo:
            break
        driver.step(todo)
    for req_id, prompt in prompts.items():
        got = driver.tokens(req_id)[len(prompt) :]
        assert got[: len(expected[req_id])] == expected[req_id]


def test_safetensors_folder_with_nested_rope_parameters(tmp_path: Path) -> None:
    """transformers 5 writes rope_theta only inside `rope_parameters`; a wrong base diverges at once."""
    hf = tiny_hf_model("qwen2", rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
    hf.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "rope_theta" not in saved and saved["rope_parameters"]["rope_theta"] == 1_000_000.0
    (tmp_path / "tokenizer.json").write_text(_tiny_tokenizer_json())
    runner = fp32_runner(load_model(tmp_path))
    driver = PagedDriver(runner)
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT * 2))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_gguf_matches_transformers_on_dequantized_weights(tmp_path: Path, qtype: str) -> None:
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    # Row length 64 is a multiple of the 32-wide Q8_0/Q4_0 blocks, so the linears are really quantized.
    hf = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype=qtype, tokenizer_kind="gpt2")
    bundle = load_model(path)
    weights = list(bundle.iter_weights())
    assert any(w.dtype == qtype for w in weights)
    # The reference: transformers on exactly the weights we run (dequantized, q/k un-permuted).
    state = {w.name: torch.tensor(w.dequantize()) for w in weights}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    runner = fp32_runner(bundle)
    prompt = PROMPT * 2
    driver = PagedDriver(runner)
    driver.add("a", prompt, GREEDY)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, prompt))
    driver.feed("a", int(logits[-1].argmax()))
    for _ in range(7):
        driver.step()
    assert driver.tokens("a")[len(prompt) :] == hf_generate(hf, prompt, 8)[:8]


GEMMA_GGUF = {
    "gemma2": {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0},
    # llama.cpp hard-codes Gemma 3's period of 6 (five sliding layers, then a global one).
    "gemma3_text": {
        "num_hidden_layers": 6,
        "layer_types": None,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    },
}


@pytest.mark.parametrize("model_type", list(GEMMA_GGUF))
def test_gemma_gguf_matches_transformers(tmp_path: Path, model_type: str) -> None:
    """llama.cpp's gemma2/gemma3 layout: four norms per layer renamed, stored as 1 + weight; the
    window, soft-caps and local RoPE base come from the metadata (GGUF has no query_pre_attn_scalar:
    head_dim, as llama.cpp assumes)."""
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    hf = tiny_hf_model(
        model_type,
        vocab_size=TINY_VOCAB_SIZE,
        head_dim=16,
        sliding_window=8,
        query_pre_attn_scalar=16,
        **GEMMA_GGUF[model_type],
    )
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype="Q8_0", tokenizer_kind="gpt2")
    bundle = load_model(path)
    assert bundle.config.model_type == model_type and bundle.config.sliding_window == 8
    weights = list(bundle.iter_weights())
    state = {w.name: torch.tensor(w.dequantize()) for w in weights}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    prompt = PROMPT * 2
    driver = PagedDriver(fp32_runner(bundle))
    driver.add("a", prompt, GREEDY)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, prompt))
    driver.feed("a", int(logits[-1].argmax()))
    for _ in range(7):
        driver.step()
    assert driver.tokens("a")[len(prompt) :] == hf_generate(hf, prompt, 8)[:8]


def test_bfloat16_runner_tracks_fp32_reference() -> None:
    """The CPU default dtype path (bf16, one-token steps through the native GEMV): close, not exact."""
    hf = tiny_hf_model("llama")
    runner = TorchRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="bfloat16"))
    driver = PagedDriver(runner)
    driver.add("a", PROMPT)
    for _ in range(4):
        _, logits = driver.step_logits()
        ref = hf_logits(hf, driver.tokens("a"))[-1]
        assert torch.nn.functional.cosine_similarity(logits[0], ref, dim=0) > 0.999
        driver.feed("a", int(ref.argmax()))


def test_unknown_architecture_lists_supported() -> None:
    hf = tiny_hf_model("llama")
    bundle = bundle_from_hf(hf)
    bundle.config = ModelConfig.from_hf_dict({**hf.config.to_dict(), "model_type": "gpt_neox"})
    with pytest.raises(
        UnsupportedArchitectureError,
        match=r"gpt_neox.*Supported: .*llama.*mistral3.*mixtral.*phi3.*qwen3_moe",
    ):
        fp32_runner(bundle)


def test_logits_rows_follow_logits_indices(pair: tuple[torch.nn.Module, TorchRunner]) -> None:
    """A middle chunk samples nothing; only finished rows get logits, in `sample_req_ids` order."""
    hf, runner = pair
    driver = PagedDriver(runner)
    driver.add("long", PROMPT * 2)
    driver.add("short", PROMPT[:5])
    ids, logits = driver.step_logits({"long": 10, "short": 5})
    assert ids == ["short"] and logits.shape[0] == 1
    np.testing.assert_allclose(logits[0].cpu().numpy(), hf_logits(hf, PROMPT[:5])[-1].numpy(), atol=ATOL)


def _tiny_tokenizer_json() -> str:
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(256)}
    return Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str()
