"""Cut a loaded Llama-family model down to one rank's slice (Megatron-style tensor parallelism).

Per layer: q heads split evenly across ranks; KV heads too, or replicated when there are fewer KV
heads than ranks (each rank keeps the one its q heads read). qkv and gate|up are column-parallel
(each rank computes its own output columns, no communication); o and down are row-parallel (each
rank multiplies its input slice, then one all-reduce sums the partial products). The embedding and
LM head are vocab-parallel: a rank looks up only the ids in its vocab range (the rest read as zero
rows, the all-reduce fills them in) and computes logits for its range (an all-gather joins them).

Only dense float weights are sliced (GGUF must be dequantized to the compute dtype: quantized block
layouts are not cut here). Each rank's paged KV pool holds only its KV heads; block tables, slot
mappings and everything else in a step's batch are the engine's, the same on every rank.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from localchat.backends.torch.attention import paged_attention, rope_paged_attention
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import add_rms_norm, apply_rope, rms_norm
from localchat.backends.torch.models.base import StepMetadata
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.backends.torch.models.llama import Model as LlamaModel
from localchat.backends.torch.quant import embed_rows, linear
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import BackendUnavailableError
from localchat.weights.config import ModelConfig

from .group import ParallelGroup


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


class ParallelLlamaLayer(LlamaLayer):
    """LlamaLayer over this rank's heads and MLP columns, with the two all-reduces of a TP layer."""

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: StepMetadata,
        kv_cache: KVCache,
        q_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        qkv = linear(rms_norm(x, self.attn_norm, self.eps), self.qkv, self.qkv_bias).view(
            tokens, h + 2 * kvh, d
        )
        qk, v = self.normalize_qk(qkv[:, : h + kvh]), qkv[:, h + kvh :]
        if q_scale is None:
            attn = rope_paged_attention(qk, v, cos, sin, kv_cache, meta, self.attn_options)
        else:
            qk = apply_rope(qk, cos, sin)
            attn = paged_attention(qk[:, :h] * q_scale, qk[:, h:], v, kv_cache, meta, self.attn_options)
        # o_bias lives on rank 0 only (shard_layer), so the sum adds it once.
        attn_out = _all_reduce(linear(attn.reshape(tokens, h * d), self.o, self.o_bias))
        x, normed = add_rms_norm(x, attn_out, self.mlp_norm, self.eps)
        return x + _all_reduce(self.mlp(normed))


class ParallelLlama(LlamaModel):
    """Vocab-parallel embedding and LM head around the sharded layers."""

    vocab_start: int
    vocab_rows: int  # real rows of this rank's vocab slice (the last one may be padded)
    vocab_size: int
    world_size: int

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_rows)
        rows = embed_rows(torch.where(mine, local, 0), self.embed, self.norm.dtype)
        return _all_reduce(rows * mine[:, None].to(rows.dtype))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        x = rms_norm(hidden, self.norm, self.config.rms_norm_eps)
        part = linear(x, self.embed if self.lm_head is None else self.lm_head).contiguous()
        parts = [torch.empty_like(part) for _ in range(self.world_size)]
        dist.all_gather(parts, part)
        return torch.cat(parts, dim=-1)[:, : self.vocab_size]


def check_supported(model: nn.Module, config: ModelConfig, world: int) -> None:
    """A clear error for what this slice does not shard."""
    if type(model) is not LlamaModel or any(type(layer) is not LlamaLayer for layer in model.layers):
        raise BackendUnavailableError(
            f"--tensor-parallel-size {world}: only the Llama family (Llama, Mistral, Qwen2, SmolLM2) "
            f"is sharded so far, not {config.model_type!r} (MoE, hybrid-state and other layouts run "
            "on one device)."
        )
    if config.num_attention_heads % world or config.intermediate_size % world:
        raise BackendUnavailableError(
            f"--tensor-parallel-size {world} must divide the attention heads "
            f"({config.num_attention_heads}) and the MLP width ({config.intermediate_size})."
        )
    kvh = config.num_key_value_heads
    if kvh % world and world % kvh:
        raise BackendUnavailableError(
            f"--tensor-parallel-size {world} and {kvh} KV heads: one must divide the other."
        )


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


def _dense(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise BackendUnavailableError(
            f"tensor parallelism slices dense float weights only; {name} is {type(t).__name__} "
            "(set LOCALCHAT_TORCH_QUANT=dequant for GGUF files)."
        )
    return t


def shard_layer(layer: LlamaLayer, config: ModelConfig, group: ParallelGroup) -> None:
    rank, world = group.rank, group.world_size
    h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    local_h = h // world
    local_kv = max(kvh // world, 1)
    # Replicated KV heads (kvh < world): rank r's q heads all read KV head r // (world // kvh).
    kv_first = rank * local_kv if kvh >= world else rank // (world // kvh)
    q_rows = torch.arange(rank * local_h * d, (rank + 1) * local_h * d)
    k_rows = h * d + torch.arange(kv_first * d, (kv_first + local_kv) * d)
    v_rows = k_rows + kvh * d
    rows = torch.cat((q_rows, k_rows, v_rows))
    qkv = _dense("qkv", layer.qkv)
    layer.qkv = _param(qkv.index_select(0, rows.to(qkv.device)))
    if layer.qkv_bias is not None:
        layer.qkv_bias = _param(layer.qkv_bias.index_select(0, rows.to(qkv.device)))
    layer.o = _param(_dense("o", layer.o)[:, rank * local_h * d : (rank + 1) * local_h * d])
    if layer.o_bias is not None and rank != 0:
        layer.o_bias = None
    inter = config.intermediate_size
    part = inter // world
    gate_up = _dense("gate_up", layer.gate_up)
    mine = slice(rank * part, (rank + 1) * part)
    layer.gate_up = _param(torch.cat((gate_up[:inter][mine], gate_up[inter:][mine])))
    layer.down = _param(_dense("down", layer.down)[:, mine])
    layer.heads, layer.kv_heads = local_h, local_kv
    layer.__class__ = ParallelLlamaLayer  # same fields, the forward with the all-reduces


def _vocab_slice(weight: torch.Tensor, start: int, rows: int, padded: int) -> nn.Parameter:
    mine = weight[start : start + rows]
    if rows < padded:  # the last rank's slice padded with zero rows so every all-gather part is equal
        mine = torch.cat((mine, mine.new_zeros(padded - rows, weight.shape[1])))
    return _param(mine)


def shard_runner(runner: TorchRunner, group: ParallelGroup) -> None:
    """Shard `runner`'s loaded model in place for `group.rank`; call before `initialize_kv_cache` (the
    KV pool is then sized for this rank's KV heads)."""
    model, config, world = runner.model, runner.config, group.world_size
    check_supported(model, config, world)
    for layer in model.layers:
        assert isinstance(layer, LlamaLayer)
        shard_layer(layer, config, group)
    vocab = config.vocab_size
    padded = -(-vocab // world)
    start = group.rank * padded
    rows = max(0, min(vocab - start, padded))
    model.embed = _vocab_slice(_dense("embed", model.embed), start, rows, padded)
    if model.lm_head is not None:
        model.lm_head = _vocab_slice(_dense("lm_head", model.lm_head), start, rows, padded)
    model.__class__ = ParallelLlama
    assert isinstance(model, ParallelLlama)
    model.vocab_start, model.vocab_rows, model.vocab_size, model.world_size = start, rows, vocab, world
    model.fused_decode = None  # the one-call C decode step has no place for the all-reduces
    runner.graph_mode = None  # CUDA graphs around NCCL calls are not captured in this slice
    runner.config = replace(
        config,
        num_attention_heads=config.num_attention_heads // world,
        num_key_value_heads=max(config.num_key_value_heads // world, 1),
    )
