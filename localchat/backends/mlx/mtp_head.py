"""The native multi-token-prediction (MTP) head of Qwen3.5 / Qwen3-Next checkpoints on MLX, as a draft
head (mtp_proposer.py drives it). The same definition as the torch head
(localchat/backends/torch/mtp_head.py, read its docstring): for the row of position p, the target's hidden
state there after its final norm and the token at p + 1 give x = fc([norm_e(embed(token)), norm_h(hidden)])
(that order); x runs one full-attention layer of the model's own kind over the head's own K/V; norm(x)
gives the draft through the target's LM head and is the hidden state the next draft reads. Every norm is
a (1 + w) RMSNorm, folded once at load as the model's are.

The layer is a one-layer build of the model's own class (models/qwen3_next.py) through the model's
loader (weights.py), so it keeps the file's quant types and runs the model's MLP (dense or MoE). Only
its attention runs here, over the proposer's per-request K/V, because the model's reads the paged cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import cast

import mlx.core as mx
import numpy as np

from localchat.arch import qwen3_next
from localchat.backends.mlx.layers import project
from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.qwen3_next import HybridLayer
from localchat.backends.mlx.quant import Embedding, Weight, linear, take_rows, to_dense, to_weight
from localchat.backends.mlx.weights import load_decoder
from localchat.errors import ModelLoadError
from localchat.weights.tensors import WeightTensor

# The head's own tensors beside its layer (names as stored, after `mtp.`).
OWN = {
    "fc.weight": "fc",
    "pre_fc_norm_embedding.weight": "norm_embed",
    "pre_fc_norm_hidden.weight": "norm_hidden",
}
# Model types whose checkpoints may carry the head this module runs (GLM-4.5's nextn form: torch only).
MTP_MODEL_TYPES = frozenset({"qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"})
# `MtpHead.run`'s callback: (span index, q, k, v, q positions) -> attention output [m, h, d]
AttendFn = Callable[[int, mx.array, mx.array, mx.array, mx.array], mx.array]


class MtpLoadError(ModelLoadError):
    """The checkpoint has no usable multi-token-prediction head for this model."""


def _layer_stream(
    weights: Iterable[WeightTensor], own: dict[str, WeightTensor], hidden: int
) -> Iterator[WeightTensor]:
    """`mtp.layers.0.X` -> `model.layers.0.X`, `mtp.norm` -> `model.norm` for the one-layer build; the
    head's own tensors go to `own`. The build is configured with a one-row vocabulary and gets a
    one-row zero embedding: the loader requires one, and the head reads the target's."""
    yield WeightTensor("model.embed_tokens.weight", (1, hidden), "F32", np.zeros((1, hidden), np.float32))
    for w in weights:
        name = w.name.removeprefix("model.").removeprefix("mtp.")
        if name in OWN:
            own[OWN[name]] = w
        elif name == "norm.weight":
            yield replace(w, name="model.norm.weight")
        elif name.startswith("layers.0."):
            yield replace(w, name="model." + name)
        elif name.startswith("layers."):
            raise MtpLoadError(f"MTP tensor {w.name}: only one-layer MTP heads are supported")


class MtpHead:
    """The head's weights and its passes: `fuse` (the target's hidden -> what the head reads), `run` (one
    batched pass: fc, the layer with per-request attention), `logits`, `feedback`."""

    def __init__(self, target: DecoderLM, layer_model: DecoderLM, own: dict[str, mx.array | Weight]) -> None:
        self.target = target
        self.layer_model = layer_model
        self.layer = cast(HybridLayer, layer_model.layers[0])
        self.fc = cast(Weight, own["fc"])
        self.norm_embed = cast(mx.array, own["norm_embed"])
        self.norm_hidden = cast(mx.array, own["norm_hidden"])
        self.eps = target.config.rms_norm_eps
        self.scale = self.layer.head_dim**-0.5

    @classmethod
    def load(cls, target: DecoderLM, weights: Iterable[WeightTensor], dtype: mx.Dtype) -> MtpHead:
        """The head from the checkpoint's `mtp.*` tensors (others are ignored). MtpLoadError when there
        are none or some are missing."""
        config = target.config
        # `mtp_weights` already turned a GGUF's tensors: the one-layer build must not turn them again.
        x = {k: v for k, v in config.extra.items() if k != "gguf_ssm_inner_size"}
        x |= {"layer_types": ["full_attention"], "mlp_only_layers": [], "gguf_nextn_layers": 0}
        one = replace(config, num_hidden_layers=1, vocab_size=1, tie_word_embeddings=True, extra=x)
        mtp = list(qwen3_next.mtp_weights(config, weights))  # views into the file: nothing read yet
        if not mtp:
            raise MtpLoadError(
                "the checkpoint carries no multi-token-prediction head (no mtp.* tensors; a GGUF converted "
                "without them, or a fine-tune that dropped them). Use --speculative ngram or draft."
            )
        stored: dict[str, WeightTensor] = {}
        try:
            layer_model = load_decoder(one, _layer_stream(mtp, stored, config.hidden_size), dtype)
        except MtpLoadError:
            raise
        except ModelLoadError as exc:
            raise MtpLoadError(f"the checkpoint's multi-token-prediction head is incomplete: {exc}") from exc
        layer_model.embed = None  # the one-row placeholder
        missing = [f"mtp.{n}" for n, key in OWN.items() if key not in stored]
        if missing:
            raise MtpLoadError(f"the checkpoint's multi-token-prediction head lacks {', '.join(missing)}")
        fc = stored["fc"]
        if tuple(fc.shape) != (config.hidden_size, 2 * config.hidden_size):
            raise MtpLoadError(f"mtp.fc.weight has shape {fc.shape}, expected [hidden, 2 x hidden]")
        own: dict[str, mx.array | Weight] = {"fc": to_weight(fc, dtype)}
        for key in ("norm_embed", "norm_hidden"):  # (1 + w) RMSNorms, folded as the model's are
            own[key] = to_dense(stored[key], dtype) + 1.0
        mx.eval([v for v in own.values() if isinstance(v, mx.array)])
        return cls(target, layer_model, own)

    def fuse(self, hidden: mx.array) -> mx.array:
        """The target's last hidden states (before its final norm) -> what the head reads: after it."""
        return mx.fast.rms_norm(hidden, self.target.norm, self.eps)

    def run(
        self,
        tokens: mx.array,
        hidden: mx.array,
        positions: mx.array,
        spans: list[tuple[int, int]],
        attend: AttendFn,
    ) -> mx.array:
        """One pass over every request's rows (`spans` of the flat batch): tokens int32 [N], hidden [N, H]
        (fused or fed back), positions int32 [N] -> the layer's outputs [N, H] (before the head's norm).
        `attend(i, q, k, v, q_positions)` files span i's K/V in its request's cache and attends over it."""
        layer = self.layer
        embeds = take_rows(cast(Embedding, self.target.embed), tokens).astype(hidden.dtype)
        joined = mx.concatenate(
            [
                mx.fast.rms_norm(embeds, self.norm_embed, self.eps),
                mx.fast.rms_norm(hidden, self.norm_hidden, self.eps),
            ],
            axis=-1,
        )
        x = linear(joined, self.fc)
        n, h, kvh, d = x.shape[0], layer.heads, layer.kv_heads, layer.head_dim
        y = project(mx.fast.rms_norm(x, layer.attn_norm, self.eps), layer.qkv)
        q_gate = y[:, : 2 * h * d].reshape(n, h, 2 * d)
        k = y[:, 2 * h * d : (2 * h + kvh) * d].reshape(n, kvh, d)
        v = y[:, (2 * h + kvh) * d :].reshape(n, kvh, d)
        q = mx.fast.rms_norm(q_gate[..., :d], layer.q_norm, self.eps)
        k = mx.fast.rms_norm(k, layer.k_norm, self.eps)
        q, k = self.target.rotary(q, positions), self.target.rotary(k, positions)
        attended = mx.concatenate(
            [attend(i, q[a:b], k[a:b], v[a:b], positions[a:b]) for i, (a, b) in enumerate(spans)]
        )
        gated = attended * mx.sigmoid(q_gate[..., d:])
        x = x + linear(gated.reshape(n, h * d), cast(Weight, layer.o))
        return x + layer.mlp(mx.fast.rms_norm(x, layer.mlp_norm, self.eps))

    def attention(
        self, q: mx.array, q_positions: mx.array, k: mx.array, v: mx.array, k_positions: mx.array
    ) -> mx.array:
        """One sequence's rows q [m, h, d] over its cached k / v [n, kvh, d], causal by position."""
        allowed = k_positions[None, :] <= q_positions[:, None]  # [m, n]
        out = mx.fast.scaled_dot_product_attention(
            q.transpose(1, 0, 2)[None],
            k.transpose(1, 0, 2)[None],
            v.transpose(1, 0, 2)[None],
            scale=self.scale,
            mask=allowed[None, None],
        )  # [1, h, m, d]; SDPA shares each K/V head among its query heads
        return out[0].transpose(1, 0, 2)

    def normed(self, out: mx.array) -> mx.array:
        return mx.fast.rms_norm(out, self.layer_model.norm, self.eps)

    def feedback(self, out: mx.array) -> mx.array:
        """The hidden state the next draft reads: the head's normed output."""
        return self.normed(out)

    def logits(self, out: mx.array) -> mx.array:
        """Layer outputs [N, H] -> logits over the target's vocabulary, through its LM head."""
        target = self.target
        head = target.lm_head if target.lm_head is not None else target.embed
        return linear(self.normed(out), cast(Weight, head))
