"""An EAGLE-3 draft head: the checkpoint (vLLM / SpecForge / `speculators` / llama.cpp `eagle3` layout)
and its forward pass.

One decoder layer reads, per row at position p, the target's token after p (embedded, normed) beside a
hidden state (normed): the target's hidden states from three layers fused by `fc` for rows the target
computed, or the head's own output of the row before for its multi-step drafts. Attention input is the
2 x hidden concatenation; the residual is the hidden state. Output: `lm_head(norm(h))` over a draft
vocabulary whose id i is target id i + d2t[i].

Checkpoint: config.json (top-level Llama keys, or speculators' `transformer_layer_config`) and
safetensors with `fc`, `midlayer.*` or `layers.0.*`, `norm`, `lm_head`, optional `d2t` / `t2d` and
`embed_tokens` (without it the target's embedding is used).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from localchat.errors import ModelLoadError

# Layers whose hidden states the head reads when the config names none (vLLM's and speculators' rule).


def default_aux_layers(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


class Eagle3LoadError(ModelLoadError):
    """The EAGLE-3 head cannot be read, or does not fit the target model."""


@dataclass(slots=True)
class Eagle3Config:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int  # the target's vocabulary (embedding rows, t2d length)
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int] | None  # None: default_aux_layers of the target
    norm_before_residual: bool = False
    norm_output: bool = False  # feed the normed output back across draft steps (speculators' Eagle 3.1)

    @classmethod
    def read(cls, folder: Path) -> Eagle3Config:
        path = folder / "config.json"
        try:
            raw: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise Eagle3LoadError(f"Cannot read the EAGLE-3 head's {path}: {exc}") from exc
        arch = " ".join(raw.get("architectures") or [])
        if "eagle3" not in arch.lower() and raw.get("speculators_model_type") != "eagle3":
            raise Eagle3LoadError(
                f"{folder} is not an EAGLE-3 head (architectures {arch or 'missing'}; expected e.g. "
                "LlamaForCausalLMEagle3 or Eagle3Speculator). For a small model with the target's "
                "vocabulary use --speculative draft."
            )
        layer = raw.get("transformer_layer_config") or raw
        if int(layer.get("num_hidden_layers", 1)) != 1:
            raise Eagle3LoadError(f"{folder}: only one-layer EAGLE-3 heads are supported")
        hidden = int(layer["hidden_size"])
        heads = int(layer["num_attention_heads"])
        rope = layer.get("rope_parameters") or {}
        eagle = raw.get("eagle_config") or {}
        aux = raw.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
        vocab = int(layer.get("vocab_size") or raw["vocab_size"])
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            intermediate_size=int(layer["intermediate_size"]),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float(layer.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            vocab_size=vocab,
            draft_vocab_size=int(raw.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab),
            target_hidden_size=int(
                raw.get("target_hidden_size") or layer.get("target_hidden_size") or hidden
            ),
            aux_layer_ids=[int(i) for i in aux] if aux else None,
            norm_before_residual=bool(raw.get("norm_before_residual", False)),
            norm_output=bool(raw.get("norm_output", False)),
        )


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise Eagle3LoadError(f"{folder} has no .safetensors file with the EAGLE-3 head's weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(str(file)).items():
            # vLLM's and SpecForge's "midlayer." is speculators' "layers.0."; some exports prefix "model.".
            name = name.removeprefix("model.").replace("midlayer.", "layers.0.")
            tensors[name] = tensor
    return tensors


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on [N, heads, d] with the half-split pairing of HF-layout weights."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Eagle3Head:
    """The head's weights on the target's device and dtype, and its one-layer forward."""

    def __init__(self, config: Eagle3Config, tensors: dict[str, torch.Tensor], folder: Path) -> None:
        self.config = config
        self.folder = folder

        def take(
            name: str, shape: tuple[int, ...] | None = None, required: bool = True
        ) -> torch.Tensor | None:
            tensor = tensors.get(name)
            if tensor is None:
                if required:
                    raise Eagle3LoadError(f"{folder}: the EAGLE-3 head has no tensor {name!r}")
                return None
            if shape is not None and tuple(tensor.shape) != shape:
                raise Eagle3LoadError(
                    f"{folder}: {name} has shape {tuple(tensor.shape)}, the config says {shape}"
                )
            return tensor

        c = config
        h, q_out, kv_out = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.weights: dict[str, torch.Tensor | None] = {
            "fc": take("fc.weight"),
            "input_norm": take("input_norm.weight", required=False),  # speculators' norm_before_fc
            "embed": take("embed_tokens.weight", required=False),
            "in_norm": take("layers.0.input_layernorm.weight", (h,)),
            "hidden_norm": take("layers.0.hidden_norm.weight", (h,)),
            "q": take("layers.0.self_attn.q_proj.weight", (q_out, 2 * h)),
            "k": take("layers.0.self_attn.k_proj.weight", (kv_out, 2 * h)),
            "v": take("layers.0.self_attn.v_proj.weight", (kv_out, 2 * h)),
            "q_bias": take("layers.0.self_attn.q_proj.bias", required=False),
            "k_bias": take("layers.0.self_attn.k_proj.bias", required=False),
            "v_bias": take("layers.0.self_attn.v_proj.bias", required=False),
            "q_norm": take("layers.0.self_attn.q_norm.weight", required=False),  # Qwen3-style heads
            "k_norm": take("layers.0.self_attn.k_norm.weight", required=False),
            "o": take("layers.0.self_attn.o_proj.weight", (h, q_out)),
            "post_norm": take("layers.0.post_attention_layernorm.weight", (h,)),
            "gate": take("layers.0.mlp.gate_proj.weight", (c.intermediate_size, h)),
            "up": take("layers.0.mlp.up_proj.weight", (c.intermediate_size, h)),
            "down": take("layers.0.mlp.down_proj.weight", (h, c.intermediate_size)),
            "norm": take("norm.weight", (h,)),
            "lm_head": take("lm_head.weight", (c.draft_vocab_size, h)),
        }
        fc = self.weights["fc"]
        assert fc is not None
        if fc.shape[0] != h or fc.shape[1] % c.target_hidden_size:
            raise Eagle3LoadError(
                f"{folder}: fc.weight has shape {tuple(fc.shape)}; expected [{h}, n x {c.target_hidden_size}]"
            )
        self.num_aux = fc.shape[1] // c.target_hidden_size
        if "fc_norm.0.weight" in tensors:
            raise Eagle3LoadError(f"{folder}: heads with per-layer fc_norm are not supported yet")
        d2t = tensors.get("d2t")
        if d2t is None and c.draft_vocab_size != c.vocab_size:
            raise Eagle3LoadError(
                f"{folder}: the draft vocabulary ({c.draft_vocab_size}) differs from the target's "
                f"({c.vocab_size}) but the head has no d2t mapping"
            )
        if d2t is not None and d2t.numel() != c.draft_vocab_size:
            raise Eagle3LoadError(
                f"{folder}: d2t has {d2t.numel()} entries, draft_vocab_size is {c.draft_vocab_size}"
            )
        ids = torch.arange(c.draft_vocab_size, dtype=torch.long)
        self.draft_to_target = ids if d2t is None else ids + d2t.long().reshape(-1)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        self.inv_freq = inv_freq.float()
        self.scale = 1.0 / math.sqrt(c.head_dim)

    @classmethod
    def load(cls, folder: str | Path) -> Eagle3Head:
        path = Path(folder).expanduser()
        if not path.is_dir():
            raise Eagle3LoadError(
                f"The EAGLE-3 head {folder} is not a folder: pass --draft-model with the folder holding "
                "the head's config.json and .safetensors"
            )
        return cls(Eagle3Config.read(path), _read_tensors(path), path)

    def check_target(
        self, target_hidden: int, target_vocab: int, target_layers: int, target_name: str
    ) -> None:
        """Raise Eagle3LoadError unless the head was trained for a target of this shape."""
        c = self.config
        problems = []
        if c.target_hidden_size != target_hidden:
            problems.append(
                f"it reads hidden states of size {c.target_hidden_size}, {target_name} has {target_hidden}"
            )
        if c.vocab_size != target_vocab:
            problems.append(f"its vocabulary has {c.vocab_size} tokens, {target_name}'s {target_vocab}")
        if int(self.draft_to_target.max()) >= target_vocab or int(self.draft_to_target.min()) < 0:
            problems.append("its d2t maps draft ids outside the target's vocabulary")
        if self.weights["embed"] is None and c.hidden_size != target_hidden:
            problems.append("it has no embed_tokens and its hidden size differs from the target's")
        layers = self.aux_layers(target_layers)
        if len(layers) != self.num_aux or not all(0 <= i <= target_layers for i in layers):
            problems.append(f"its aux layers {layers} do not fit a target of {target_layers} layers")
        if problems:
            raise Eagle3LoadError(
                f"The EAGLE-3 head {self.folder} was not trained for {target_name}: " + "; ".join(problems)
            )

    def aux_layers(self, target_layers: int) -> list[int]:
        return self.config.aux_layer_ids or default_aux_layers(target_layers)

    def to(self, device: torch.device, dtype: torch.dtype) -> None:
        for name, tensor in self.weights.items():
            if tensor is not None:
                self.weights[name] = tensor.to(device=device, dtype=dtype)
        self.draft_to_target = self.draft_to_target.to(device)
        self.inv_freq = self.inv_freq.to(device)

    # -- forward -------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.inv_freq.device

    def embed(self, tokens: torch.Tensor, model: Any) -> torch.Tensor:
        """The head's own embedding of `tokens`, else the target `model`'s."""
        table = self.weights["embed"]
        return table[tokens] if table is not None else model.embed_tokens(tokens)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Target hidden states [N, n x target_hidden] -> the head's hidden input [N, hidden]."""
        w = self.weights
        if w["input_norm"] is not None:
            aux = _rms(aux, w["input_norm"], self.config.rms_norm_eps)
        assert w["fc"] is not None
        return F.linear(aux, w["fc"])

    def qkv(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q [N, h, d], k [N, kvh, d], v [N, kvh, d], residual [N, hidden]) of the layer's rows."""
        c, w = self.config, self.weights
        eps = c.rms_norm_eps
        normed_hidden = _rms(hidden, w["hidden_norm"], eps)  # type: ignore[arg-type]
        residual = normed_hidden if c.norm_before_residual else hidden
        x = torch.cat([_rms(embeds, w["in_norm"], eps), normed_hidden], dim=-1)  # type: ignore[arg-type]
        n = x.shape[0]
        q = F.linear(x, w["q"], w["q_bias"]).view(n, c.num_heads, c.head_dim)  # type: ignore[arg-type]
        k = F.linear(x, w["k"], w["k_bias"]).view(n, c.num_kv_heads, c.head_dim)  # type: ignore[arg-type]
        v = F.linear(x, w["v"], w["v_bias"]).view(n, c.num_kv_heads, c.head_dim)  # type: ignore[arg-type]
        if w["q_norm"] is not None and w["k_norm"] is not None:
            q, k = _rms(q, w["q_norm"], eps), _rms(k, w["k_norm"], eps)
        angles = positions.to(self.inv_freq.dtype)[:, None] * self.inv_freq[None, :]
        cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
        sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v, residual

    def attend(
        self,
        q: torch.Tensor,
        q_positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_positions: torch.Tensor,
    ) -> torch.Tensor:
        """One sequence's rows q [m, h, d] over its cached k/v [n, kvh, d]: causal by position."""
        c = self.config
        group = c.num_heads // c.num_kv_heads
        keys = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [h, n, d]
        values = v.repeat_interleave(group, dim=1).transpose(0, 1)
        allowed = k_positions[None, :] <= q_positions[:, None]  # [m, n]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), keys, values, attn_mask=allowed[None], scale=self.scale
        )  # [h, m, d]
        return out.transpose(0, 1).reshape(q.shape[0], c.num_heads * c.head_dim)

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Attention output [N, h*d] -> the layer's output [N, hidden] (before the final norm)."""
        w, eps = self.weights, self.config.rms_norm_eps
        x = residual + F.linear(attn, w["o"])  # type: ignore[arg-type]
        normed = _rms(x, w["post_norm"], eps)  # type: ignore[arg-type]
        return x + F.linear(F.silu(F.linear(normed, w["gate"])) * F.linear(normed, w["up"]), w["down"])  # type: ignore[arg-type]

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Layer output [N, hidden] -> draft-vocabulary logits [N, draft_vocab]."""
        w = self.weights
        return F.linear(_rms(out, w["norm"], self.config.rms_norm_eps), w["lm_head"])  # type: ignore[arg-type]

    def feedback(self, out: torch.Tensor) -> torch.Tensor:
        """The hidden state the next draft step reads."""
        if self.config.norm_output:
            return _rms(out, self.weights["norm"], self.config.rms_norm_eps)  # type: ignore[arg-type]
        return out
