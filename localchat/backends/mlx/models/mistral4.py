"""Mistral 4 on MLX: Ministral 3's step (the per-token q temperature) over DeepSeek layers (MLA and the
shared-expert MoE), as in the torch model file."""

from __future__ import annotations

from localchat.backends.mlx.models import ministral3
from localchat.backends.mlx.models.deepseek import DeepseekLayer


class Model(ministral3.Model):
    layer_class = DeepseekLayer  # type: ignore[assignment]  # its __call__ takes the same q scale
