"""A tiny Qwen3.5-shaped config.json (gated DeltaNet + full attention) for the RAM-estimate tests of the
hybrid state pool, and the recurrent state one sequence holds in it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TINY_QWEN3_5_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 8,  # every 4th full attention: 6 linear-attention layers
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}
# Per linear-attention layer: the conv window, 3 x (2*32 + 32) bf16 values, and the recurrent state,
# 4 x 16 x 8 float32; 6 such layers. Written out by hand so a change in the estimate's sizing shows.
TINY_QWEN3_5_STATE_BYTES = 6 * (3 * 96 * 2 + 4 * 16 * 8 * 4)


def write_tiny_qwen3_5_config(folder: Path, **overrides: Any) -> None:
    """folder/config.json: the tiny Qwen3.5 config with `overrides` on top."""
    (folder / "config.json").write_text(json.dumps({**TINY_QWEN3_5_CONFIG, **overrides}))
