"""Qwen3.5 (dense text model) and Qwen3-Next (sparse MoE MLPs with a gated shared expert): gated DeltaNet linear-attention layers
interleaved with full attention (`layer_types`; every 4th layer is full attention in the released models).

- Full-attention layers: q_proj gives each head's query and an output gate side by side; per-head
  q/k RMSNorm; RoPE on the first `partial_rotary_factor` of head_dim; output * sigmoid(gate) before o.
- Linear-attention layers (gated_deltanet.py): one projection to q|k|v, z, b, a; a causal conv over
  q|k|v; the gated delta rule (decay g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)); an
  RMSNorm gated by silu(z) per value head; out_proj. Their state sits in a slot (state_cache.py).
- Every RMSNorm but the gated one scales by (1 + weight): `after_load` folds the 1 in.
Qwen3.5's multimodal RoPE is plain RoPE for text (all three position streams are the token index).
"""

from __future__ import annotations

from functools import partial
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from localchat.arch.moe import MoeSpec
from localchat.backends.torch.attention import rope_paged_attention
from localchat.backends.torch.cpu import deltanet_step
from localchat.backends.torch.gated_deltanet import (
    conv_decode,
    conv_prefill,
    delta_rule_chunked,
    delta_rule_step,
    l2_normalize,
)
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import empty_param, fused_kernels, rms_norm, swiglu
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.models.moe import Expert, SparseMoe
from localchat.backends.torch.models.partial_sums import PartialSums
from localchat.backends.torch.mrope import MRotary
from localchat.backends.torch.quant import linear
from localchat.backends.torch.recurrent_kernels import use_triton_recurrent
from localchat.backends.torch.state_cache import LayerStateShape, StateCache, StepRows, Zeros
from localchat.engine.interface import StateCacheSpec
from localchat.weights.config import ModelConfig


class SharedExpertMoe(SparseMoe):
    """Qwen3-Next's MLP: the routed experts plus a shared SwiGLU expert scaled by sigmoid(gate . x)."""

    def __init__(self, spec: MoeSpec, hidden: int, shared_size: int) -> None:
        super().__init__(spec, hidden)
        self.shared = Expert(hidden, shared_size)
        self.shared_gate = empty_param(1, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = linear(swiglu(linear(x, self.shared.gate_up)), self.shared.down)
        return super().forward(x) + torch.sigmoid(linear(x, self.shared_gate)) * shared


class HybridLayer(PartialSums):
    """One decoder layer: a full-attention or a linear-attention mixer, then the SwiGLU MLP."""

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        x = config.extra
        hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.linear = x["layer_types"][index] == "linear_attention"
        self.attn_norm = empty_param(hidden)
        self.mlp_norm = empty_param(hidden)
        self.gate_up: nn.Parameter | None = empty_param(2 * config.intermediate_size, hidden)
        self.down: nn.Parameter | None = empty_param(hidden, config.intermediate_size)
        self.moe: SharedExpertMoe | None = None
        if x.get("num_experts"):
            spec = MoeSpec.from_config(config)
            if index in spec.sparse_layers:
                shared = int(x.get("shared_expert_intermediate_size") or 0)
                self.moe = SharedExpertMoe(spec, hidden, shared)
                self.gate_up = self.down = None  # no dense MLP to ask the checkpoint for
        if self.linear:
            self.k_heads, self.v_heads = x["linear_num_key_heads"], x["linear_num_value_heads"]
            self.dk, self.dv = x["linear_key_head_dim"], x["linear_value_head_dim"]
            key_dim, value_dim = self.k_heads * self.dk, self.v_heads * self.dv
            self.conv_channels = 2 * key_dim + value_dim
            self.in_proj = empty_param(self.conv_channels + value_dim + 2 * self.v_heads, hidden)
            self.conv = empty_param(self.conv_channels, 1, x["linear_conv_kernel_dim"])
            self.dt_bias = empty_param(self.v_heads)
            self.A_log = empty_param(self.v_heads)
            self.gated_norm = empty_param(self.dv)
            self.out = empty_param(hidden, value_dim)
            self._dn_params: deltanet_step.DeltaNetParams | None = None  # the C decode step's form, made once
        else:
            h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
            self.heads, self.kv_heads, self.head_dim = h, kvh, d
            self.qkv = empty_param((2 * h + 2 * kvh) * d, hidden)  # q and its gate per head, k, v
            self.qk_norm = empty_param(h + kvh, d)
            self.o = empty_param(hidden, h * d)

    def state_shape(self) -> LayerStateShape:
        width = self.conv.shape[-1] - 1
        return LayerStateShape(self.conv_channels, width, self.v_heads, self.dk, self.dv)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.moe is not None:
            return self.moe.forward(x)
        assert self.gate_up is not None and self.down is not None
        return linear(swiglu(linear(x, self.gate_up)), self.down)

    def attention(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: StepMetadata, kv_cache: KVCache
    ) -> torch.Tensor:
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        y = linear(x, self.qkv)
        q_gate = y[:, : 2 * h * d].view(tokens, h, 2 * d)
        k = y[:, 2 * h * d : (2 * h + kvh) * d].view(tokens, kvh, d)
        v = y[:, (2 * h + kvh) * d :].view(tokens, kvh, d)
        qk = torch.cat((q_gate[..., :d], k), dim=1)
        qk = rms_norm(qk, None, self.eps) * self.qk_norm
        attn = rope_paged_attention(qk, v, cos, sin, kv_cache, meta)  # [T, h, d]
        gated = attn * torch.sigmoid(q_gate[..., d:])
        return linear(gated.reshape(tokens, h * d), self.o)

    def linear_attention(
        self,
        x: torch.Tensor,
        rows: StepRows,
        cache: StateCache,
        slot: int,
        spans: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x [T, hidden] normed -> [T, hidden], reading and updating layer `slot`'s states in `cache`.
        `spans`: the rows as (starts [R + 1], slots [R]) for the C step (made from `rows` if not given)."""
        nv, dv = self.v_heads, self.dv
        y = linear(x, self.in_proj)
        conv_state, rec_state = cache.conv[slot], cache.recurrent[slot]
        ops = fused_kernels(y)
        if spans is None and ops is not None:
            spans = deltanet_step.spans_of(rows, x.shape[0])
        if (
            spans is not None
            and not use_triton_recurrent(x.device)
            and deltanet_step.available(ops, y, conv_state, dv, keep=bool(rows.verify))
        ):
            # One C call for every row (conv, delta rule, gated norm), in place on their slots.
            assert ops is not None
            if self._dn_params is None:
                self._dn_params = deltanet_step.DeltaNetParams.of(
                    self.conv[:, 0, :], self.A_log, self.dt_bias, self.gated_norm, self.k_heads, self.dk
                )
            gated = deltanet_step.deltanet_step(
                ops, y, spans, conv_state, rec_state, self._dn_params, nv, dv, self.eps, rows.keep
            )
        else:
            gated = torch.empty(x.shape[0], nv * dv, dtype=x.dtype, device=x.device)
            self._torch_rows(y, rows, conv_state, rec_state, gated)
        return linear(gated, self.out)

    def _torch_rows(
        self,
        y: torch.Tensor,
        rows: StepRows,
        conv_state: torch.Tensor,
        rec_state: torch.Tensor,
        gated: torch.Tensor,
    ) -> None:
        """The torch forms (and Triton's decode kernels on CUDA), from the in_proj output y, written into
        gated [T, nv * dv] as RMSNorm(o) * silu(z)."""
        nk, nv, dk, dv = self.k_heads, self.v_heads, self.dk, self.dv
        c = self.conv_channels
        mixed, z = y[:, :c], y[:, c : c + nv * dv]
        b, a = y[:, c + nv * dv : c + nv * dv + nv], y[:, c + nv * dv + nv :]
        beta = torch.sigmoid(b.float())
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        weight = self.conv[:, 0, :]

        def heads(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            # [n, C] after the conv -> q, k [n, nv, dk] (normalised; k heads shared by nv / nk value heads),
            # v [n, nv, dv]
            n = m.shape[0]
            q = l2_normalize(m[:, : nk * dk].float().view(n, nk, dk)) * dk**-0.5
            k = l2_normalize(m[:, nk * dk : 2 * nk * dk].float().view(n, nk, dk))
            v = m[:, 2 * nk * dk :].view(n, nv, dv)
            if nv != nk:
                q, k = q.repeat_interleave(nv // nk, dim=1), k.repeat_interleave(nv // nk, dim=1)
            return q, k, v

        def gate(core: torch.Tensor, z_rows: torch.Tensor) -> torch.Tensor:
            n = core.shape[0]
            normed = rms_norm(core.to(y.dtype), self.gated_norm, self.eps)
            return (normed.float() * F.silu(z_rows.float().view(n, nv, dv))).to(y.dtype).reshape(n, nv * dv)

        idx, slots = rows.decode_tokens, rows.decode_slots
        if idx is not None:
            assert slots is not None
            if use_triton_recurrent(y.device):
                # imports Triton: CUDA (or its interpreter)
                from localchat.backends.torch.cuda import triton_recurrent

                out = triton_recurrent.conv_step(mixed[idx], conv_state, slots, weight, None, silu=True)
                o = triton_recurrent.delta_rule_step(out, g[idx], beta[idx], rec_state, slots, nk)
            else:
                out, windows = conv_decode(mixed[idx], conv_state.index_select(0, slots), weight)
                conv_state.index_copy_(0, slots, windows.to(conv_state.dtype))
                q, k, v = heads(out)
                o, new_state = delta_rule_step(q, k, v, g[idx], beta[idx], rec_state.index_select(0, slots))
                rec_state.index_copy_(0, slots, new_state)
            gated[idx] = gate(o, z[idx])
        for start, end, row_slot in rows.prefills:
            out, window = conv_prefill(mixed[start:end], conv_state[row_slot], weight)
            conv_state[row_slot] = window.to(conv_state.dtype)
            q, k, v = heads(out)
            o, new_state = delta_rule_chunked(q, k, v, g[start:end], beta[start:end], rec_state[row_slot])
            rec_state[row_slot] = new_state
            gated[start:end] = gate(o, z[start:end])
        for (
            t,
            row_slot,
            keep,
        ) in rows.verify_tokens():  # decode form per position, states kept (hybrid_spec.py)
            out, window = conv_decode(mixed[t : t + 1], conv_state[row_slot : row_slot + 1], weight)
            conv_state[row_slot] = window[0].to(conv_state.dtype)
            q, k, v = heads(out)
            o, new_state = delta_rule_step(
                q, k, v, g[t : t + 1], beta[t : t + 1], rec_state[row_slot : row_slot + 1]
            )
            rec_state[row_slot] = new_state[0]
            gated[t : t + 1] = gate(o, z[t : t + 1])
            if keep >= 0:
                conv_state[keep], rec_state[keep] = conv_state[row_slot], rec_state[row_slot]


def _device_zeros(device: torch.device, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, device=device)


class Model(DecoderLM):
    layer_class = HybridLayer
    capturable = False  # the state slots are gathered per step: no fixed-address decode graph
    # Qwen3.5's pictures (backends/torch/vision/qwen_vl.py): (rows of this step's tokens, values) written
    # over the placeholder embeddings; set and cleared by the runner around one step.
    image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None
    # An EAGLE-3 head's taps (backends/torch/hybrid_taps.py): the inputs of these layers (index L: the
    # output) go to `kept` each step; empty (the plain path) costs one test per step.
    keep_layers: frozenset[int] = frozenset()

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        if config.extra.get("mrope_section"):  # [3, T] positions of a step with pictures (mrope.py)
            self.rotary = MRotary(config, device)
        types = config.extra["layer_types"]
        self.linear_layers = [i for i, t in enumerate(types) if t == "linear_attention"]
        self.num_kv_layers = len(types) - len(self.linear_layers)
        self.states: StateCache | None = None
        self.rows: StepRows | None = None
        self.spans: tuple[torch.Tensor, torch.Tensor] | None = None
        self.spans_tokens = 0
        self.kept: dict[int, torch.Tensor] = {}

    @property
    def hybrid_layers(self) -> list[HybridLayer]:
        return [cast(HybridLayer, layer) for layer in self.layers]

    def _state_shapes(self) -> list[LayerStateShape]:
        return [self.hybrid_layers[i].state_shape() for i in self.linear_layers]

    def after_load(self) -> None:
        """(1 + weight) RMSNorms: fold the 1 in once (the gated norm inside DeltaNet is a plain scale)."""
        with torch.no_grad():
            self.norm.add_(1.0)
            for layer in self.hybrid_layers:
                layer.attn_norm.add_(1.0)
                layer.mlp_norm.add_(1.0)
                if not layer.linear:
                    layer.qk_norm.add_(1.0)

    def decode_plan(self) -> None:
        return None  # the fused C decode step knows only transformer layers

    def state_cache_spec(self, dtype: torch.dtype) -> StateCacheSpec | None:
        """None when every layer is full attention (a config may list no linear layers)."""
        shapes = self._state_shapes()
        if not shapes:
            return None
        return StateCacheSpec(len(shapes), sum(s.bytes_per_slot(dtype) for s in shapes))

    def initialize_state_cache(self, num_slots: int, dtype: torch.dtype, zeros: Zeros) -> None:
        self.states = StateCache(self._state_shapes(), num_slots, dtype, zeros)

    def begin_step(
        self,
        slots: np.ndarray | None,
        query_start_loc: np.ndarray,
        positions: np.ndarray,
        device: torch.device,
        keep: np.ndarray | None = None,
    ) -> None:
        """Bind this step's rows to their state slots. Without slots (the runner's warm-up forward) each
        row gets a scratch slot of its own. `keep`: BatchInputs.state_keep (speculative verify rows)."""
        if slots is None:
            slots = np.arange(len(query_start_loc) - 1, dtype=np.int64)
            if self.states is None or self.states.num_slots < len(slots):
                self.states = StateCache(
                    self._state_shapes(), len(slots), self.norm.dtype, partial(_device_zeros, device)
                )
        self.rows = StepRows.from_batch(slots, query_start_loc, positions, device, keep)
        # the C step's form of the rows (cpu/deltanet_step.py): token offsets and slots of the rows with tokens
        has_tokens = np.diff(query_start_loc) > 0
        starts = np.concatenate(([0], np.asarray(query_start_loc[1:])[has_tokens])).astype(np.int64)
        self.spans = (
            torch.from_numpy(starts),
            torch.from_numpy(np.ascontiguousarray(slots[has_tokens], dtype=np.int64)),
        )
        self.spans_tokens = int(starts[-1])
        assert self.states is not None
        self.rows.reset(self.states)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        assert self.rows is not None and self.states is not None, "begin_step binds the state slots"
        x = self.embed_tokens(input_ids)
        if self.image_embeds is not None:
            rows, values = self.image_embeds
            x = x.index_copy(0, rows, values.to(x.dtype))
        cos, sin = self.rotary(positions, x.dtype)
        kv_index = state_index = 0
        spans = self.spans if self.spans_tokens == x.shape[0] else None  # else made from the rows
        keep = self.keep_layers
        for index, layer in enumerate(self.hybrid_layers):
            if keep and index in keep:
                self.kept[index] = x
            normed = rms_norm(x, layer.attn_norm, layer.eps)
            # DeltaNet's out_proj, attention's o and the MLP's down are row-parallel: one sum each.
            if layer.linear:
                out = layer.linear_attention(normed, self.rows, self.states, state_index, spans)
                state_index += 1
            else:
                out = layer.attention(normed, cos, sin, meta, kv_caches[kv_index])
                kv_index += 1
            x = x + layer.reduce_partial(out)
            x = x + layer.reduce_partial(layer.mlp(rms_norm(x, layer.mlp_norm, layer.eps)))
        if keep:
            self.kept[len(self.layers)] = x
        return x
