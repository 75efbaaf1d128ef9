"""Qwen3.5 (dense text model) on MLX: gated DeltaNet linear-attention layers interleaved with gated full
attention (`layer_types`), as localchat/backends/torch/models/qwen3_next.py computes it (read its
docstring for the layer). The DeltaNet states live in state slots (state_cache.py), not the KV cache.

Qwen3-Next and Qwen3.5-MoE: every MLP a sparse MoE (softmax top-k) plus a shared SwiGLU expert scaled
by sigmoid(gate . x).
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx
import numpy as np

from localchat.arch.moe import MoeSpec
from localchat.backends.mlx.attention import AttentionMetadata, LayerCache, paged_attention
from localchat.backends.mlx.gated_deltanet import (
    conv_decode,
    conv_prefill,
    delta_rule_chunked,
    delta_rule_step,
    l2_normalize,
)
from localchat.backends.mlx.layers import Rotary, project, silu
from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.moe import Expert, SparseMoe, WithMoe
from localchat.backends.mlx.mrope import MRotary
from localchat.backends.mlx.quant import Weight, linear
from localchat.backends.mlx.state_cache import LayerStateShape, StateCache, StepRows
from localchat.engine.interface import StateCacheSpec
from localchat.weights.config import ModelConfig


class SharedExpertMoe(SparseMoe):
    """Qwen3-Next's MLP: the routed experts plus a shared SwiGLU expert scaled by sigmoid(gate . x)."""

    def __init__(self, spec: MoeSpec, hidden: int, shared_size: int) -> None:
        super().__init__(spec, hidden)
        self.shared = Expert(hidden, shared_size)
        self.shared_gate: Weight | None = None
        self.declare("shared_gate", 1, hidden)

    def missing(self) -> list[str]:
        return super().missing() + [f"shared.{name}" for name in self.shared.missing()]

    def forward(self, x: mx.array) -> mx.array:
        assert self.shared.down is not None and self.shared_gate is not None
        gate, up = mx.split(project(x, self.shared.gate_up), 2, axis=-1)
        shared = linear(silu(gate) * up, self.shared.down)
        return super().forward(x) + mx.sigmoid(linear(x, self.shared_gate)) * shared


class HybridLayer(WithMoe):
    """One decoder layer: a full-attention or a linear-attention mixer, then the SwiGLU MLP."""

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        x = config.extra
        hidden, inter = config.hidden_size, config.intermediate_size
        self.eps = config.rms_norm_eps
        self.linear = x["layer_types"][index] == "linear_attention"
        self.attn_norm: mx.array | None = None
        self.mlp_norm: mx.array | None = None
        self.gate_up: Weight | list[Weight] | None = None
        self.down: Weight | None = None
        self.declare("attn_norm", hidden)
        self.declare("mlp_norm", hidden)
        self.declare("gate_up.0", inter, hidden)
        self.declare("gate_up.1", inter, hidden)
        self.declare("down", hidden, inter)
        self.moe: SharedExpertMoe | None = None
        if x.get("num_experts"):
            spec = MoeSpec.from_config(config)
            if index in spec.sparse_layers:
                shared = int(x.get("shared_expert_intermediate_size") or 0)
                self.moe = SharedExpertMoe(spec, hidden, shared)
                for key in ("gate_up.0", "gate_up.1", "down"):  # no dense MLP to ask the checkpoint for
                    del self.shapes[key]
        if self.linear:
            self.k_heads, self.v_heads = x["linear_num_key_heads"], x["linear_num_value_heads"]
            self.dk, self.dv = x["linear_key_head_dim"], x["linear_value_head_dim"]
            key_dim, value_dim = self.k_heads * self.dk, self.v_heads * self.dv
            self.conv_channels = 2 * key_dim + value_dim
            self.kernel = x["linear_conv_kernel_dim"]
            self.in_proj: Weight | list[Weight] | None = None
            self.conv: mx.array | None = None
            self.dt_bias: mx.array | None = None
            self.A_log: mx.array | None = None
            self.gated_norm: mx.array | None = None
            self.out: Weight | None = None
            for part, rows in enumerate((self.conv_channels, value_dim, self.v_heads, self.v_heads)):
                self.declare(f"in_proj.{part}", rows, hidden)
            self.declare("conv", self.conv_channels, 1, self.kernel)
            self.declare("dt_bias", self.v_heads)
            self.declare("A_log", self.v_heads)
            self.declare("gated_norm", self.dv)
            self.declare("out", hidden, value_dim)
        else:
            h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
            self.heads, self.kv_heads, self.head_dim = h, kvh, d
            self.qkv: Weight | list[Weight] | None = None
            self.q_norm: mx.array | None = None
            self.k_norm: mx.array | None = None
            self.o: Weight | None = None
            for part, rows in enumerate((2 * h * d, kvh * d, kvh * d)):  # q and its gate per head, k, v
                self.declare(f"qkv.{part}", rows, hidden)
            self.declare("q_norm", d)
            self.declare("k_norm", d)
            self.declare("o", hidden, h * d)

    def state_shape(self) -> LayerStateShape:
        return LayerStateShape(self.conv_channels, self.kernel - 1, self.v_heads, self.dk, self.dv)

    def mlp(self, x: mx.array) -> mx.array:
        if self.moe is not None:
            return self.moe.forward(x)
        assert self.down is not None
        gate, up = mx.split(project(x, self.gate_up), 2, axis=-1)
        return linear(silu(gate) * up, self.down)

    def attention(
        self, x: mx.array, rotary: Rotary, positions: mx.array, meta: AttentionMetadata, cache: LayerCache
    ) -> mx.array:
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        y = project(x, self.qkv)
        q_gate = y[:, : 2 * h * d].reshape(tokens, h, 2 * d)
        k = y[:, 2 * h * d : (2 * h + kvh) * d].reshape(tokens, kvh, d)
        v = y[:, (2 * h + kvh) * d :].reshape(tokens, kvh, d)
        q = mx.fast.rms_norm(q_gate[..., :d], self.q_norm, self.eps)
        k = mx.fast.rms_norm(k, self.k_norm, self.eps)
        q, k = rotary(q, positions), rotary(k, positions)
        attn = paged_attention(q, k, v, cache, meta, d**-0.5, None)  # [T, h, d]
        gated = attn * mx.sigmoid(q_gate[..., d:])
        assert self.o is not None
        return linear(gated.reshape(tokens, h * d), self.o)

    def linear_attention(self, x: mx.array, rows: StepRows, cache: StateCache, slot: int) -> mx.array:
        """x [T, hidden] normed -> [T, hidden], reading and updating layer `slot`'s states in `cache`."""
        assert self.conv is not None and self.A_log is not None and self.dt_bias is not None
        assert self.out is not None
        tokens = x.shape[0]
        nk, nv, dk, dv = self.k_heads, self.v_heads, self.dk, self.dv
        y = project(x, self.in_proj)
        c = self.conv_channels
        mixed, z = y[:, :c], y[:, c : c + nv * dv]
        b, a = y[:, c + nv * dv : c + nv * dv + nv], y[:, c + nv * dv + nv :]
        beta = mx.sigmoid(b.astype(mx.float32))
        dt = a.astype(mx.float32) + self.dt_bias.astype(mx.float32)
        g = -mx.exp(self.A_log.astype(mx.float32)) * mx.logaddexp(dt, mx.zeros_like(dt))  # softplus
        conv_state, rec_state = cache.conv[slot], cache.recurrent[slot]
        weight = self.conv[:, 0, :]

        def heads(m: mx.array) -> tuple[mx.array, mx.array, mx.array]:
            # [n, C] after the conv -> q, k [n, nv, dk] (k heads shared by nv / nk value heads), v [n, nv, dv]
            n = m.shape[0]
            q = l2_normalize(m[:, : nk * dk].astype(mx.float32).reshape(n, nk, dk)) * dk**-0.5
            k = l2_normalize(m[:, nk * dk : 2 * nk * dk].astype(mx.float32).reshape(n, nk, dk))
            v = m[:, 2 * nk * dk :].reshape(n, nv, dv)
            if nv != nk:
                q, k = mx.repeat(q, nv // nk, axis=1), mx.repeat(k, nv // nk, axis=1)
            return q, k, v

        pieces: list[tuple[mx.array, mx.array]] = []  # (token indices, outputs [n, nv, dv])
        if rows.decode_tokens is not None:
            idx, slots = rows.decode_tokens, rows.decode_slots
            assert slots is not None
            out, windows = conv_decode(mixed[idx], conv_state[slots], weight)
            conv_state[slots] = windows.astype(conv_state.dtype)
            q, k, v = heads(out)
            o, new_state = delta_rule_step(q, k, v, g[idx], beta[idx], rec_state[slots])
            rec_state[slots] = new_state
            pieces.append((idx, o))
        for start, end, row_slot in rows.prefills:
            out, window = conv_prefill(mixed[start:end], conv_state[row_slot], weight)
            conv_state[row_slot] = window.astype(conv_state.dtype)
            q, k, v = heads(out)
            o, new_state = delta_rule_chunked(q, k, v, g[start:end], beta[start:end], rec_state[row_slot])
            rec_state[row_slot] = new_state
            pieces.append((mx.arange(start, end, dtype=mx.int32), o))
        for (
            t,
            row_slot,
            keep,
        ) in rows.verify_tokens():  # decode form per position, states kept (hybrid_spec.py)
            out, windows = conv_decode(mixed[t : t + 1], conv_state[row_slot : row_slot + 1], weight)
            conv_state[row_slot] = windows[0].astype(conv_state.dtype)
            q, k, v = heads(out)
            o, new_state = delta_rule_step(
                q, k, v, g[t : t + 1], beta[t : t + 1], rec_state[row_slot : row_slot + 1]
            )
            rec_state[row_slot] = new_state[0]
            if keep >= 0:
                conv_state[keep] = conv_state[row_slot]
                rec_state[keep] = rec_state[row_slot]
            pieces.append((mx.array([t], dtype=mx.int32), o))
        order = mx.concatenate([p[0] for p in pieces])
        core = mx.zeros((tokens, nv, dv), dtype=mx.float32)
        core[order] = mx.concatenate([p[1] for p in pieces])
        normed = mx.fast.rms_norm(core.astype(x.dtype), self.gated_norm, self.eps)
        gated = normed.astype(mx.float32) * silu(z.astype(mx.float32).reshape(tokens, nv, dv))
        return linear(gated.astype(x.dtype).reshape(tokens, nv * dv), self.out)


class Model(DecoderLM):
    layer_class = HybridLayer

    # Qwen3.5's pictures (backends/mlx/vision/qwen_vl.py): (rows of this step's tokens, values) written over
    # the placeholder embeddings; set and cleared by the runner around one step.
    image_embeds: tuple[mx.array, mx.array] | None = None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.extra.get("mrope_section"):  # [3, T] positions of a step with pictures
            self.rotary = MRotary(config)
        types = config.extra["layer_types"]
        self.linear_layers = [i for i, t in enumerate(types) if t == "linear_attention"]
        self.num_kv_layers = len(types) - len(self.linear_layers)
        self.states: StateCache | None = None
        self.rows: StepRows | None = None

    @property
    def hybrid_layers(self) -> list[HybridLayer]:
        return [cast(HybridLayer, layer) for layer in self.layers]

    def _state_shapes(self) -> list[LayerStateShape]:
        return [self.hybrid_layers[i].state_shape() for i in self.linear_layers]

    def after_load(self) -> None:
        """(1 + weight) RMSNorms: fold the 1 in once (the gated norm inside DeltaNet is a plain scale)."""
        assert self.norm is not None
        self.norm = self.norm + 1.0
        for layer in self.hybrid_layers:
            assert layer.attn_norm is not None and layer.mlp_norm is not None
            layer.attn_norm, layer.mlp_norm = layer.attn_norm + 1.0, layer.mlp_norm + 1.0
            if not layer.linear:
                assert layer.q_norm is not None and layer.k_norm is not None
                layer.q_norm, layer.k_norm = layer.q_norm + 1.0, layer.k_norm + 1.0
        # Evaluated here, on the loading thread: no pending work may stay bound to its stream (runner.py).
        layers = self.hybrid_layers
        folded = [self.norm, *(y.attn_norm for y in layers), *(y.mlp_norm for y in layers)]
        folded += [n for y in layers if not y.linear for n in (y.q_norm, y.k_norm)]
        mx.eval(folded)

    def state_cache_spec(self, dtype: mx.Dtype) -> StateCacheSpec | None:
        """None when every layer is full attention (a config may list no linear layers)."""
        shapes = self._state_shapes()
        if not shapes:
            return None
        return StateCacheSpec(len(shapes), sum(s.bytes_per_slot(dtype) for s in shapes))

    def initialize_state_cache(self, num_slots: int, dtype: mx.Dtype) -> None:
        self.states = None  # drop the old pool first: its memory is reused
        self.states = StateCache(self._state_shapes(), num_slots, dtype)

    def state_arrays(self) -> list[mx.array]:
        return self.states.arrays() if self.states is not None else []

    def begin_step(
        self,
        slots: np.ndarray | None,
        query_start_loc: np.ndarray,
        positions: np.ndarray,
        dtype: mx.Dtype,
        keep: np.ndarray | None = None,
    ) -> None:
        """Bind this step's rows to their state slots. Without slots (a step outside the engine) each row
        gets a scratch slot of its own. `keep`: BatchInputs.state_keep (speculative verify rows)."""
        if slots is None:
            slots = np.arange(len(query_start_loc) - 1, dtype=np.int64)
            if self.states is None or self.states.num_slots < len(slots):
                self.states = StateCache(self._state_shapes(), len(slots), dtype)
        self.rows = StepRows.from_batch(slots, query_start_loc, positions, keep)
        assert self.states is not None
        self.rows.reset(self.states)

    def hidden_states(
        self, input_ids: mx.array, positions: mx.array, meta: AttentionMetadata, caches: list[LayerCache]
    ) -> mx.array:
        assert self.rows is not None and self.states is not None, "begin_step binds the state slots"
        x = self.embed_tokens(input_ids)
        if self.image_embeds is not None:
            rows, values = self.image_embeds
            x[rows] = values.astype(x.dtype)
        kv_index = state_index = 0
        for layer in self.hybrid_layers:
            normed = mx.fast.rms_norm(x, layer.attn_norm, layer.eps)
            if layer.linear:
                x = x + layer.linear_attention(normed, self.rows, self.states, state_index)
                state_index += 1
            else:
                x = x + layer.attention(normed, self.rotary, positions, meta, caches[kv_index])
                kv_index += 1
            x = x + layer.mlp(mx.fast.rms_norm(x, layer.mlp_norm, layer.eps))
        return x
