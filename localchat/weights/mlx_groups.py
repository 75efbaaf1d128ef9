"""The bits a GGUF type takes in MLX's affine groups of 32, and so the bytes MLX holds for a tensor.

Here rather than in localchat/backends/mlx/quant.py (which converts the blocks, and imports it from here)
because the RAM estimate (localchat/models/memory.py) needs the same table without importing mlx.

MLX's form of a quantized matrix is `bits` per value plus a scale and a bias per 32 values in the compute
dtype (bfloat16 / float16: 1 bit a weight more, float32: 2), whatever the GGUF block held: so even the
exactly mapped types differ from their file size (Q4_0: 4.5 bits in the file, 5 in bf16), and the
re-quantized ones by much more (Q3_K: 3.44 in the file, 6 in bf16; IQ4_XS: 4.25 -> 7).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

GROUP_SIZE = 32
# Types whose blocks map exactly onto MLX groups (quant.py, gguf_blocks.py), at these bits.
EXACT_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8, "Q5_0": 5, "Q5_1": 5, "Q4_K": 4, "Q5_K": 5}
# No exact MLX form (scales per 16 values): dequantized, then quantized to this many bits, the fewest that
# keep the added error small beside the type's own. Relative RMS error against the original weights
# (random normal, tests/helpers/kquants.py's encoders): Q3_K 0.181 as stored, 0.186 at 5 bits (4: 0.198);
# Q2_K 0.329 as stored, 0.335 at 4 bits. Q6_K at 8 stays within a quarter of its own step.
# i-quants (llama-quantize on normal weights, a flat importance matrix; own error -> with the re-quantization,
# and at one bit fewer): IQ4_NL / IQ4_XS 0.075 -> 0.077 at 6 bits (5: 0.082); IQ3_S 0.137 -> 0.143 at 5
# (4: 0.160); IQ3_XXS 0.182 -> 0.188 at 5 (4: 0.195); IQ2_S 0.249 -> 0.259 at 4 (3: 0.298); IQ2_XS 0.300
# -> 0.308 at 4; IQ2_XXS 0.344 -> 0.347 at 4; IQ1_M 0.451 -> 0.469 at 3; IQ1_S 0.485 -> 0.491 at 4 (3:
# 0.513). docs/backends.md has the table. TQ1_0 / TQ2_0 map exactly onto 2 bits (scale d, bias -d).
REQUANTIZED = {
    "Q6_K": 8,
    "Q3_K": 5,
    "Q2_K": 4,
    "IQ4_NL": 6,
    "IQ4_XS": 6,
    "IQ3_S": 5,
    "IQ3_XXS": 5,
    "IQ2_S": 4,
    "IQ2_XS": 4,
    "IQ2_XXS": 4,
    "IQ1_M": 3,
    "IQ1_S": 4,
    "TQ1_0": 2,
    "TQ2_0": 2,
}
# Exactly mapped with their own group sizes (backends/mlx/lowbit.py): type -> (bits, values per group).
# NVFP4 / MXFP4 in MLX's "nvfp4" / "mxfp4" modes (uint8 e4m3 / e8m0 scales, no bias), Q1_0 / Q2_0 as
# affine groups of a block. Stacked experts (3-D) keep the same form (backends/mlx/models/moe.py).
LOWBIT_GROUPS = {"NVFP4": (4, 16), "MXFP4": (4, 32), "Q1_0": (1, 128), "Q2_0": (2, 64)}
_FLOAT_TYPES = ("F32", "F16", "BF16")


def mlx_tensor_bytes(qtype: str, dims: Sequence[int], stored: int, value_bytes: int) -> int:
    """The bytes MLX holds for a GGUF tensor of type `qtype` (`dims` innermost first, as GGUF lists them;
    `stored`: its size in the file) with `value_bytes` per value of the compute dtype: float tensors and
    types without an MLX group form at the compute dtype, MXFP4 as stored (MLX's mxfp4 holds the same 17
    bytes per 32), NVFP4 / Q1_0 / Q2_0 matrices at LOWBIT_GROUPS, matrices (3-D: stacked experts, each its
    own matrix) of the types above at their bits plus a scale and bias per 32 values. Mirrors quant.to_weight / to_embedding
    as weights.load_decoder calls them."""
    values = prod(dims)
    if qtype == "MXFP4":
        return stored
    if qtype in LOWBIT_GROUPS and len(dims) in (2, 3):
        width, group = LOWBIT_GROUPS[qtype]
        per_group = 1 if qtype == "NVFP4" else 2 * value_bytes  # an e4m3 byte, or scale and bias
        return values * width // 8 + values // group * per_group
    bits = EXACT_BITS.get(qtype) or REQUANTIZED.get(qtype)
    if qtype in _FLOAT_TYPES or bits is None or len(dims) not in (2, 3) or dims[0] % GROUP_SIZE:
        return values * value_bytes
    return values * bits // 8 + values // GROUP_SIZE * 2 * value_bytes
