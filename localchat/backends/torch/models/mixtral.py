"""Mixtral (8x7B, 8x22B): Llama's attention with a sparse mixture of SwiGLU experts as every MLP.

Its router takes the softmax over the top-k logits, which equals renormalising the top-k probabilities.
"""

from __future__ import annotations

from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.models.moe import MoeLayer


class Model(DecoderLM):
    layer_class = MoeLayer
    capturable = False  # expert dispatch sizes its groups on the host (moe.py)
