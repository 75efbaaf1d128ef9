"""Mixture-of-experts settings, read once from a config (backend-neutral): how many experts, how many
each token uses, their width, and which layers are sparse."""

from __future__ import annotations

from dataclasses import dataclass

from localchat.errors import ModelLoadError
from localchat.weights.config import ModelConfig


@dataclass(frozen=True, slots=True)
class MoeSpec:
    experts: int
    top_k: int
    renormalize: bool  # divide the top-k router probabilities by their sum
    expert_size: int  # each expert's intermediate width
    sparse_layers: frozenset[int]  # the others keep a dense MLP of `intermediate_size`
    shared_size: int = 0  # DeepSeek: a dense SwiGLU of this width every token also goes through (0: none)

    @classmethod
    def from_config(cls, config: ModelConfig) -> MoeSpec:
        extra = config.extra
        experts = _experts(config)
        top_k = int(extra.get("num_experts_per_tok") or 0)
        if experts <= 0 or not 0 < top_k <= experts:
            raise ModelLoadError(
                f"This {config.model_type} config names {experts} experts with {top_k} per token; "
                "the model file is damaged or not a mixture of experts."
            )
        step = max(1, int(extra.get("decoder_sparse_step") or 1))
        dense_only = {int(i) for i in extra.get("mlp_only_layers") or []}
        dense_only |= set(
            range(int(extra.get("first_k_dense_replace") or 0))
        )  # DeepSeek's leading dense layers
        expert_size = int(extra.get("moe_intermediate_size") or config.intermediate_size)
        return cls(
            experts=experts,
            top_k=top_k,
            renormalize=bool(extra.get("norm_topk_prob", True)),
            expert_size=expert_size,
            sparse_layers=frozenset(
                i for i in range(config.num_hidden_layers) if i not in dense_only and (i + 1) % step == 0
            ),
            shared_size=int(extra.get("n_shared_experts") or 0) * expert_size,
        )


def _experts(config: ModelConfig) -> int:
    extra = config.extra  # Qwen3-MoE, Mixtral, DeepSeek name the count differently
    return int(
        extra.get("num_experts") or extra.get("num_local_experts") or extra.get("n_routed_experts") or 0
    )


def ffn_width(config: ModelConfig) -> int:
    """A layer's feed-forward width summed over its experts (memory estimates): the dense MLP's for
    dense models."""
    if not _experts(config):
        return config.intermediate_size
    spec = MoeSpec.from_config(config)
    return spec.experts * spec.expert_size + spec.shared_size
