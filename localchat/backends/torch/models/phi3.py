"""Phi-3 / Phi-3.5-mini, Phi-4-mini: Llama's layer exactly, once the checkpoint's fused `qkv_proj` and
`gate_up_proj` land on the fused parameters (registry). What differs lives in the shared ops: partial
rotary (Phi-4-mini turns 3/4 of each head) and longrope scaling (localchat/arch/rope.py)."""

from __future__ import annotations

from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.models.llama import LlamaLayer


class Model(DecoderLM):
    layer_class = LlamaLayer
