"""Mistral 4 (Mistral Small 4): DeepSeek-V3's layer (multi-head latent attention, a shared-expert MoE with
a softmax router) plus Ministral 3's per-token q temperature after RoPE, 1 + beta * log(1 + floor(position
/ original length)). The step is Ministral 3's (the scale computed once per step from the positions) over
DeepSeek layers, which take it as their `q_temperature`."""

from __future__ import annotations

from localchat.backends.torch.models import ministral3
from localchat.backends.torch.models.deepseek import DeepseekLayer


class Model(ministral3.Model):
    layer_class = DeepseekLayer  # type: ignore[assignment]  # its forward takes the same q scale
    capturable = False  # expert dispatch sizes its groups on the host (moe.py)
