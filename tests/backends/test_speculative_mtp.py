"""`--speculative mtp` on the torch runner: the native multi-token-prediction head of a tiny random
Qwen3.5 (gated DeltaNet + gated attention, float32) with random `mtp.*` tensors in the published layout.

- Every draft the proposer makes in a real engine run equals a plain-torch reference of the head from its
  published definition (fc over [norm_e(embed(next token)), norm_h(target's last hidden after its final
  norm)], transformers' own Qwen3.5 decoder layer as the MTP layer, norm, the shared LM head), and its
  logits match; handing the head the hidden state before the final norm instead changes the drafts.
- Output equals plain decoding token for token, greedy and seeded sampling, with drafts kept and rejected.
- A head built to agree with a bigram target (every layer's output projection zeroed) has every draft
  kept: the tokens and positions it is fed line up with the target's.
- The model's own load skips the `mtp.*` tensors; a model without them gets a typed refusal.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models

from localchat.backends.fake import FakeTokenizer
from localchat.backends.torch.mtp_head import MtpLoadError
from localchat.backends.torch.mtp_proposer import attach_mtp
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import SpeculativeConfig
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from localchat.weights.tensors import WeightTensor
from tests.backends.test_qwen3_next import tiny_qwen3_5
from tests.helpers.fake_engine import drain
from tests.helpers.mtp import last_logits, record_drafts
from tests.helpers.torch_models import fp32_runner

VOCAB = 256
FULL_LAYER = 3  # a full-attention layer of the tiny model: its names and shapes are the MTP layer's


def mtp_tensors(hf: Any, seed: int) -> dict[str, torch.Tensor]:
    """Random `mtp.*` tensors in the published layout (norms stored as w of (1 + w))."""
    gen = torch.Generator().manual_seed(seed)
    hidden = hf.config.hidden_size
    out: dict[str, torch.Tensor] = {}
    prefix = f"model.layers.{FULL_LAYER}."
    for name, value in hf.state_dict().items():
        if name.startswith(prefix):
            out["mtp.layers.0." + name[len(prefix) :]] = 0.25 * torch.randn(value.shape, generator=gen)
    out["mtp.fc.weight"] = 0.15 * torch.randn(hidden, 2 * hidden, generator=gen)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{norm}.weight"] = 0.2 * torch.randn(hidden, generator=gen)
    return out


def bundle(hf: Any, mtp: dict[str, torch.Tensor]) -> ModelBundle:
    config = ModelConfig.from_hf_dict(hf.config.to_dict())
    state = {**{k: v.detach().clone() for k, v in hf.state_dict().items()}, **mtp}

    def iter_weights() -> Any:
        for key, tensor in state.items():
            yield WeightTensor(key, tuple(tensor.shape), "F32", tensor.numpy())

    path = Path("tiny-mtp")
    return ModelBundle("tiny-mtp", path, "safetensors", config, iter_weights, tokenizer=None)  # type: ignore[arg-type]


# -- the reference -----------------------------------------------------------------------------------


def gemma_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


class Reference:
    """The MTP head from its published definition, over one sequence's tokens, with no cache: every
    call recomputes the target and the head from the start."""

    def __init__(self, hf: Any, mtp: dict[str, torch.Tensor], hidden_before_norm: bool = False) -> None:
        self.hf, self.mtp, self.eps = hf, mtp, hf.config.rms_norm_eps
        self.before_norm = hidden_before_norm
        self.layer = copy.deepcopy(hf.model.layers[FULL_LAYER])
        self.layer.load_state_dict(
            {k.removeprefix("mtp.layers.0."): v for k, v in mtp.items() if ".layers." in k}
        )

    def run(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        m, eps = self.mtp, self.eps
        joined = torch.cat(
            [
                gemma_rms(embeds, m["mtp.pre_fc_norm_embedding.weight"], eps),
                gemma_rms(hidden, m["mtp.pre_fc_norm_hidden.weight"], eps),
            ],
            -1,
        )
        x = joined @ m["mtp.fc.weight"].T
        n = x.shape[0]
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        rope = self.hf.model.rotary_emb(x[None], positions[None])
        out = self.layer(x[None], position_embeddings=rope, attention_mask=mask, position_ids=positions[None])
        return (out[0] if isinstance(out, tuple) else out)[0]

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return gemma_rms(out, self.mtp["mtp.norm.weight"], self.eps) @ self.hf.lm_head.weight.T

    def drafts(self, tokens: list[int], computed: int, k: int) -> tuple[list[int], torch.Tensor]:
        """The k greedy drafts after `tokens` (the target computed the first `computed`), and the
        logits of draft 1."""
        with torch.no_grad():
            ids = torch.tensor([tokens[:computed]])
            kept: list[torch.Tensor] = []
            hook = self.hf.model.norm.register_forward_pre_hook(lambda _, args: kept.append(args[0]))
            try:
                result = self.hf.model(ids)
            finally:
                hook.remove()
            hidden = kept[0][0] if self.before_norm else result.last_hidden_state[0]
            embed = self.hf.model.embed_tokens.weight
            rows_embeds = embed[torch.tensor(tokens[1 : computed + 1])]
            positions = torch.arange(computed)
            out = self.run(rows_embeds, hidden, positions)
            first = self.logits(out[-1:])[0]
            drafts = [int(first.argmax())]
            while len(drafts) < k:
                # one more row: the latest draft at the next position, the head's own normed output as hidden
                rows_embeds = torch.cat([rows_embeds, embed[drafts[-1]][None]])
                feed = gemma_rms(out[-1:], self.mtp["mtp.norm.weight"], self.eps)
                hidden = torch.cat([hidden, feed])
                positions = torch.arange(len(positions) + 1)
                out = self.run(rows_embeds, hidden, positions)
                drafts.append(int(self.logits(out[-1:])[0].argmax()))
        return drafts, first


# -- engine runs -------------------------------------------------------------------------------------


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(3)
    return [[int(t) for t in rng.integers(3, VOCAB, size=n)] for n in (19, 26)]


def engine(target: ModelBundle, method: str, k: int = 3) -> LLMEngine:
    runner = fp32_runner(target)
    proposer = attach_mtp(runner, target.iter_weights(), "tiny", VOCAB) if method == "mtp" else None
    spec = SpeculativeConfig(method, num_tokens=k, max_batch=4)
    cfg = EngineConfig(kv_cache_mib=8, block_size=4, speculative=spec)
    return LLMEngine(
        runner, FakeTokenizer(), cfg, eos_token_ids=[], model_max_len=256, proposer=proposer, vocab_size=VOCAB
    )


def run(eng: LLMEngine, params: SamplingParams) -> list[list[int]]:
    ids = [eng.add_request(p, params) for p in prompts()]
    got: dict[str, list[int]] = {r: [] for r in ids}
    for out in drain(eng):
        got[out.req_id] += out.new_token_ids
    return [got[r] for r in ids]


GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
SEEDED = SamplingParams(max_tokens=24, temperature=0.9, seed=11)


@pytest.fixture(scope="module")
def hf() -> Any:
    return tiny_qwen3_5(seed=2)


def bigram(hf: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """The target with every layer's output projection zeroed (the next token depends on the current one
    only), and an MTP head that reads only the next token's embedding and maps it the target's way."""
    target = copy.deepcopy(hf)
    with torch.no_grad():
        for name, param in target.named_parameters():
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                param.zero_()
    mtp = mtp_tensors(target, seed=5)
    hidden = hf.config.hidden_size
    mtp["mtp.fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], 1)
    mtp["mtp.pre_fc_norm_embedding.weight"] = torch.zeros(hidden)
    mtp["mtp.norm.weight"] = target.model.norm.weight.detach().clone()
    for name in ("mtp.layers.0.self_attn.o_proj.weight", "mtp.layers.0.mlp.down_proj.weight"):
        mtp[name] = torch.zeros_like(mtp[name])
    return target, mtp


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_next"])
def test_drafts_and_logits_equal_the_reference_head(hf: Any, kind: str) -> None:
    hf = hf if kind == "qwen3_5" else tiny_qwen3_next()  # Qwen3-Next: the MTP layer's MLP is a MoE
    mtp = mtp_tensors(hf, seed=1)
    eng = engine(bundle(hf, mtp), "mtp")
    proposer: Any = eng.scheduler.proposer
    seen = record_drafts(proposer, last_logits)
    run(eng, GREEDY)
    assert len(seen) >= 8
    reference = Reference(hf, mtp)
    for tokens, computed, k, drafts, logits in seen:
        want, want_logits = reference.drafts(tokens, computed, k)
        assert drafts == want
        assert (logits - want_logits).abs().max().item() < 2e-3
    # The hidden state before the target's final norm gives other logits: the test sees the difference.
    wrong = Reference(hf, mtp, hidden_before_norm=True)
    assert max((wrong.drafts(t, c, k)[1] - got).abs().max().item() for t, c, k, _, got in seen) > 0.05


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_random_head_output_equals_plain_decoding(hf: Any, params: SamplingParams) -> None:
    check_random_head_equals_plain(engine, hf, params)


def check_random_head_equals_plain(
    engine_for: Callable[[ModelBundle, str], LLMEngine], hf: Any, params: SamplingParams
) -> None:
    """A random (seed-1) head through `engine_for`: output equals plain decoding, and drafts were made
    and rejected (fixed up). The MLX test runs it too."""
    target = bundle(hf, mtp_tensors(hf, seed=1))
    plain = run(engine_for(target, "off"), params)
    eng = engine_for(target, "mtp")
    assert eng.speculation_note == "" and eng.scheduler.spec_rows is not None
    assert run(eng, params) == plain
    assert eng.spec_draft_tokens > 0 and eng.scheduler.spec_rows.fixups_total > 0  # drafts rejected


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_head_that_agrees_with_a_bigram_target_has_its_drafts_kept(hf: Any, params: SamplingParams) -> None:
    check_bigram_drafts_kept(engine, hf, params)


def check_bigram_drafts_kept(
    engine_for: Callable[[ModelBundle, str], LLMEngine], hf: Any, params: SamplingParams
) -> None:
    """On the bigram target with its agreeing head, `engine_for`'s mtp engine equals its plain one, drafts
    more than 20 tokens and keeps every greedy draft (some seeded ones). The MLX test runs it too."""
    target_hf, mtp = bigram(hf)
    target = bundle(target_hf, mtp)
    plain = run(engine_for(target, "off"), params)
    eng = engine_for(target, "mtp")
    assert run(eng, params) == plain
    assert eng.spec_draft_tokens > 20
    if params.temperature == 0.0:
        assert eng.spec_accepted_tokens == eng.spec_draft_tokens
    else:
        assert eng.spec_accepted_tokens > 0


def test_model_load_skips_the_head_and_a_model_without_one_is_refused(hf: Any) -> None:
    runner = fp32_runner(bundle(hf, mtp_tensors(hf, seed=1)))  # the mtp.* names do not trip the model's load
    with pytest.raises(MtpLoadError, match="no multi-token-prediction head"):
        attach_mtp(fp32_runner(bundle(hf, {})), bundle(hf, {}).iter_weights(), "tiny", VOCAB)
    assert runner.hidden_taps is None  # nothing is filed until a head is attached


def save(hf: Any, folder: Path, mtp: dict[str, torch.Tensor]) -> Path:
    """`hf` saved by transformers, the `mtp.*` tensors added to its safetensors file."""
    hf.save_pretrained(folder)
    file = folder / "model.safetensors"
    save_file({**load_file(str(file)), **mtp}, str(file))
    vocab = {f"t{i}": i for i in range(VOCAB)}
    (folder / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    return folder


def tiny_qwen3_next() -> Any:
    """Qwen3-Next (every MLP a sparse MoE with a shared expert; DeltaNet projections grouped on disk)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    from tests.backends.test_qwen3_next import TINY
    from tests.backends.test_qwen3_next_moe import MOE

    torch.manual_seed(0)
    kwargs: dict[str, Any] = {**TINY, **MOE, "norm_topk_prob": True, "decoder_sparse_step": 1}
    config = Qwen3NextConfig(**kwargs)
    model = Qwen3NextForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith(("A_log", "dt_bias")):
                param.copy_(0.25 * torch.randn_like(param))
    return model


def test_llm_api_mtp_and_auto_on_a_qwen3_next_folder(tmp_path: Path) -> None:
    """A saved Qwen3-Next folder with a MoE MTP layer: `mtp` and `auto` (which picks the head) give plain
    greedy's tokens; the same folder without the head: `mtp` is refused, `auto` picks as before."""
    from localchat import LLM
    from localchat.serving.mtp import has_mtp_head

    hf = tiny_qwen3_next()
    with_head = save(hf, tmp_path / "with", mtp_tensors(hf, seed=3))
    without = save(hf, tmp_path / "without", {})
    assert any(".mlp.experts." in n for n in mtp_tensors(hf, seed=3))  # the MTP layer is a MoE layer too
    prompt = prompts()[0]
    params = SamplingParams(max_tokens=16, temperature=0.0)
    plain = LLM(with_head, backend="torch", dtype="float32", speculative="off").generate([prompt], params)
    for method in ("mtp", "auto"):
        llm = LLM(with_head, backend="torch", dtype="float32", speculative=method)
        assert llm.engine.config.speculative.method == "mtp", method
        assert llm.generate([prompt], params)[0].token_ids == plain[0].token_ids
        assert llm.engine.spec_draft_tokens > 0
    assert has_mtp_head(load_model(with_head)) and not has_mtp_head(load_model(without))
    with pytest.raises(MtpLoadError, match="no multi-token-prediction head"):
        LLM(without, backend="torch", dtype="float32", speculative="mtp")
    assert (
        LLM(without, backend="torch", dtype="float32", speculative="auto").engine.config.speculative.method
        != "mtp"
    )
