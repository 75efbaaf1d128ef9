"""The native multi-token-prediction (MTP) head of Qwen3.5 / Qwen3-Next checkpoints (and GLM-4.5's
nextn layer, `MtpHead.nextn`), as a draft head.

Published layout (`mtp.*` in the safetensors; the embedding and LM head are the model's own):
`fc` [H, 2H], `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `layers.0.*` (one full-attention decoder
layer of the model's kind: gated attention, then the model's MLP, dense or MoE) and `norm`; every norm is
a (1 + w) RMSNorm like the model's. For the row of position p the head reads the target's hidden state
there after the target's final norm (what vLLM's and SGLang's `qwen3_next_mtp` hand it) and the token
at p + 1: x = fc([norm_e(embed(token)), norm_h(hidden)]) (that order); x runs the layer with the head's
own K/V; norm(x) gives the draft token through the shared LM head and is the hidden state the head
reads for its next draft.

The layer is a one-layer build of the model's own class (models/qwen3_next.py), loaded by the model's
loader (weights.py): its weights keep the file's quant type the same way the model's do, and its MLP
(MoE or dense) is the model's code. Only the attention runs here, over a per-request cache
(eagle3_proposer.py keeps it), because the model's attention reads the engine's paged K/V.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any, cast

import torch
import torch.nn.functional as F

from localchat.arch import nextn, qwen3_next
from localchat.backends.torch.layers import apply_rope, rms_norm
from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.backends.torch.models.qwen3_next import HybridLayer
from localchat.backends.torch.quant import QuantPolicy, Weight, convert, finalize, linear
from localchat.backends.torch.weights import load_decoder
from localchat.errors import ModelLoadError
from localchat.weights.tensors import WeightTensor

# The head's own tensors beside its layer (names as stored, after `mtp.`).
OWN = {
    "fc.weight": "fc",
    "pre_fc_norm_embedding.weight": "norm_embed",
    "pre_fc_norm_hidden.weight": "norm_hidden",
    "lm_head.weight": "lm_head",  # GLM-4.5's nextn layer carries its own (shared_head.head)
}
OPTIONAL = frozenset({"lm_head"})
# GLM-4.5 (nextn layers in the DeepSeek-V3 layout, arch/nextn.py): plain RMSNorms, the layer is the
# model's Llama-style attention with its MoE; Qwen3.5 / Qwen3-Next: (1 + w) norms, gated attention.
NEXTN_MODEL_TYPES = frozenset({"glm4_moe"})


class MtpLoadError(ModelLoadError):
    """The checkpoint has no usable multi-token-prediction head for this model."""


def _layer_stream(weights: Iterable[WeightTensor], own: dict[str, WeightTensor]) -> Iterator[WeightTensor]:
    """`mtp.layers.0.X` -> `model.layers.0.X` and `mtp.norm` -> `model.norm` for the one-layer build;
    the head's own tensors go to `own`."""
    for w in weights:
        name = w.name.removeprefix("mtp.")
        if name in OWN:
            own[OWN[name]] = w
        elif name == "norm.weight":
            yield replace(w, name="model.norm.weight")
        elif name.startswith("layers.0."):
            yield replace(w, name="model." + name)
        elif name.startswith("layers."):
            raise MtpLoadError(f"MTP tensor {w.name}: only one-layer MTP heads are supported")
        # anything else (GLM's copy of the embedding) is the model's own: not kept twice


@contextlib.contextmanager
def one_row_gemv(x: torch.Tensor) -> Iterator[None]:
    """torch's own GEMV for one-row bfloat16 matmuls on CPU, as the runner's steps use it
    (runner.py `_matmul_backend`): a draft pass of one stream is one row, and the 248k-row LM head of
    Qwen3.5 takes 11 ms that way against 24 ms through oneDNN (2 threads)."""
    if x.shape[0] != 1 or x.device.type != "cpu" or x.dtype != torch.bfloat16:
        yield
        return
    previous = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = previous


def _drop_embedding_and_head(model: DecoderLM) -> None:
    """The one-layer build reads the target's embedding and LM head: it holds none of its own."""
    model.embed = None  # type: ignore[assignment]
    model.lm_head = None


class MtpHead:
    """The head's weights and forward in the shape the EAGLE-3 proposer drives (eagle3_proposer.py
    `DraftHead`): fuse, qkv, attend, finish, logits, feedback. `nextn`: GLM-4.5's form (vLLM's
    `glm4_moe_mtp`): the Llama-style layer, the first position's embedding zeroed, its own LM head, and
    the layer's output before the norm fed to the next draft."""

    def __init__(self, target: DecoderLM, layer_model: DecoderLM, own: dict[str, Weight]) -> None:
        self.target = target
        self.layer_model = layer_model
        self.nextn = target.config.model_type in NEXTN_MODEL_TYPES
        self.layer = cast(HybridLayer, layer_model.layers[0])
        if not self.nextn and self.layer.linear:
            raise MtpLoadError("the MTP layer must be a full-attention layer")
        self.lm_head = own.get("lm_head")
        self.fc = own["fc"]
        self.norm_embed = cast(torch.Tensor, own["norm_embed"])
        self.norm_hidden = cast(torch.Tensor, own["norm_hidden"])
        self.eps = target.config.rms_norm_eps
        vocab = target.config.vocab_size
        self.device = target.norm.device
        self.draft_to_target = torch.arange(vocab, dtype=torch.long, device=self.device)
        self.scale = 1.0 / math.sqrt(self.layer.head_dim)

    @classmethod
    def load(
        cls,
        target: DecoderLM,
        weights: Iterable[WeightTensor],
        device: torch.device,
        dtype: torch.dtype,
        policy: QuantPolicy,
    ) -> MtpHead:
        """The head from the checkpoint's `mtp.*` tensors (others are ignored). MtpLoadError when there
        are none or some are missing."""
        config = target.config
        # The one-layer build reads the tensors as `mtp_weights` already turned them (a GGUF's too): its
        # own load must not turn them again.
        x = {k: v for k, v in config.extra.items() if k != "gguf_ssm_inner_size"}
        x |= {
            "mlp_only_layers": [],
            "gguf_nextn_layers": 0,
            "first_k_dense_replace": 0,
        }  # a MoE if the model's are
        nextn_form = config.model_type in NEXTN_MODEL_TYPES
        if not nextn_form:
            x["layer_types"] = ["full_attention"]
        one = replace(config, num_hidden_layers=1, extra=x)
        stored: dict[str, WeightTensor] = {}
        reader = nextn.mtp_weights if nextn_form else qwen3_next.mtp_weights
        mtp = list(reader(config, weights))  # views into the file: nothing is read yet
        if not mtp:
            raise MtpLoadError(
                "the checkpoint carries no multi-token-prediction head (no mtp.* tensors; a GGUF converted "
                "without them, or a fine-tune that dropped them). Use --speculative ngram or draft."
            )
        try:
            layer_model = load_decoder(
                one, _layer_stream(mtp, stored), device, dtype, policy, _drop_embedding_and_head
            )
        except MtpLoadError:
            raise
        except ModelLoadError as exc:
            raise MtpLoadError(f"the checkpoint's multi-token-prediction head is incomplete: {exc}") from exc
        missing = [f"mtp.{n}" for n, key in OWN.items() if key not in stored and key not in OPTIONAL]
        if missing:
            raise MtpLoadError(f"the checkpoint's multi-token-prediction head lacks {', '.join(missing)}")
        own: dict[str, Weight] = {}
        for key, w in stored.items():
            rule = policy if key in ("fc", "lm_head") else QuantPolicy()
            if key == "fc" and tuple(w.shape)[:1] != (config.hidden_size,):
                raise MtpLoadError(
                    f"mtp.fc.weight has shape {w.shape}, expected [{config.hidden_size}, 2 x hidden]"
                )
            loaded = finalize(convert(w, dtype, device, rule), dtype, device, rule)
            if key.startswith("norm") and not nextn_form:  # (1 + w) RMSNorms, folded as the model's are
                loaded = cast(torch.Tensor, loaded) + 1.0
            own[key] = loaded
        return cls(target, layer_model, own)

    # -- the DraftHead interface ---------------------------------------------------------------------

    def embed(self, tokens: torch.Tensor, model: DecoderLM) -> torch.Tensor:
        return model.embed_tokens(tokens)

    def fuse(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's last hidden states (before its final norm) -> what the head reads: after it."""
        return rms_norm(hidden, self.target.norm, self.eps)

    def qkv(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """(q [N, h, d] and k [N, kvh, d] rotated, v [N, kvh, d], (residual, output gate))."""
        if self.nextn:  # vLLM's glm4_moe_mtp zeroes the first position's embedding (not needed there)
            embeds = embeds.masked_fill((positions == 0)[:, None], 0.0)
        with one_row_gemv(embeds):
            return self._qkv(embeds, hidden, positions)

    def _qkv(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        layer = self.layer
        joined = torch.cat(
            [rms_norm(embeds, self.norm_embed, self.eps), rms_norm(hidden, self.norm_hidden, self.eps)], -1
        )
        x = linear(joined, self.fc)
        n, h, kvh, d = x.shape[0], layer.heads, layer.kv_heads, layer.head_dim
        cos, sin = self.target.rotary(positions, x.dtype)
        if self.nextn:
            llama = cast(LlamaLayer, layer)
            y = linear(rms_norm(x, llama.attn_norm, llama.eps), llama.qkv, llama.qkv_bias).view(
                n, h + 2 * kvh, d
            )
            qk = apply_rope(llama.normalize_qk(y[:, : h + kvh]), cos, sin)
            return qk[:, :h], qk[:, h:], y[:, h + kvh :], (x, None)
        y = linear(rms_norm(x, layer.attn_norm, layer.eps), layer.qkv)
        q_gate = y[:, : 2 * h * d].view(n, h, 2 * d)
        k = y[:, 2 * h * d : (2 * h + kvh) * d].view(n, kvh, d)
        v = y[:, (2 * h + kvh) * d :].view(n, kvh, d)
        qk = rms_norm(torch.cat((q_gate[..., :d], k), dim=1), None, layer.eps) * layer.qk_norm
        qk = apply_rope(qk, cos, sin)
        return qk[:, :h], qk[:, h:], v, (x, q_gate[..., d:])

    def attend(
        self,
        q: torch.Tensor,
        q_positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_positions: torch.Tensor,
    ) -> torch.Tensor:
        """One sequence's rows q [m, h, d] over its cached k/v [n, kvh, d], causal by position: [m, h*d]."""
        group = q.shape[1] // k.shape[1]
        keys = k.repeat_interleave(group, dim=1).transpose(0, 1)
        values = v.repeat_interleave(group, dim=1).transpose(0, 1)
        allowed = k_positions[None, :] <= q_positions[:, None]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), keys, values, attn_mask=allowed[None], scale=self.scale
        )
        return out.transpose(0, 1).reshape(q.shape[0], -1)

    def finish(self, attn: torch.Tensor, carry: Any) -> torch.Tensor:
        """Attention output [N, h*d] -> the layer's output [N, hidden] (before the head's norm)."""
        residual, gate = carry
        layer = self.layer
        n = attn.shape[0]
        if gate is None:  # GLM's plain attention output (o may have a bias)
            o_bias = cast(LlamaLayer, layer).o_bias
            gated = attn.reshape(n, -1)
        else:
            o_bias, gated = (
                None,
                (attn.view(n, layer.heads, layer.head_dim) * torch.sigmoid(gate)).reshape(n, -1),
            )
        with one_row_gemv(attn):
            x = residual + linear(gated, layer.o, o_bias)
            return x + layer.mlp(rms_norm(x, layer.mlp_norm, layer.eps))

    def feedback(self, out: torch.Tensor) -> torch.Tensor:
        """The hidden state the next draft reads: the head's normed output (GLM's: the output itself)."""
        return out if self.nextn else self._normed(out)

    def _normed(self, out: torch.Tensor) -> torch.Tensor:
        return rms_norm(out, self.layer_model.norm, self.eps)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Layer output [N, hidden] -> logits over the target's vocabulary, through its LM head."""
        target = self.target
        head = self.lm_head
        if head is None:
            head = target.embed if target.lm_head is None else target.lm_head
        with one_row_gemv(out):
            return linear(self._normed(out), cast(Weight, head))
