"""What `--isq` turns each dense matrix into, and how many bytes that takes: one rule for the torch backend
(backends/torch/cpu/isq.py applies it) and for the pre-load RAM check (models/memory.py sizes with it).

- `q8_0` / `q4_k` / `q4_0`: every 2-D float matrix becomes GGUF blocks run by localchat's CPU kernels.
  Linears take the chosen type (Q4_K rows that do not split into 256s fall back to Q5_0, as llama.cpp
  does); the token embedding and LM head take Q8_0, the output layer being the most sensitive to
  quantization (llama.cpp keeps it at 6-8 bits too).
- `q4`: torch's int4 kernel for the linears (4-bit codes + a bf16 scale and zero per 32 values: 5 bits
  per weight); embedding and LM head stay dense. Dense bf16 copies for many-row steps are added on the
  CPU only when they fit in RAM, so they are not part of what a load needs.
"""

from __future__ import annotations

from typing import Literal

from localchat.kernels.blocks import BLOCKS
from localchat.weights.x16 import loaded_block_bytes

BLOCK_TYPES = {"q8_0": "Q8_0", "q4_k": "Q4_K", "q4_0": "Q4_0"}  # --isq value -> GGUF type
HEAD_TYPE = "Q8_0"
FALLBACK = {"Q4_K": "Q5_0"}  # for rows that do not split into Q4_K's 256s (llama.cpp's choice too)
INT4_GROUP, INT4_ROWS = 32, 16  # torch's int4 pack: groups along `in`, `out` a multiple of 16
INT4_BITS = 4 + 2 * 16 / INT4_GROUP  # codes + bf16 scale and zero per group
HEAD_NAMES = ("embed_tokens.weight", "lm_head.weight")
# The layer parameters (last part of the registry's parameter path) the backend runs through `linear`:
# the matrices `--isq` quantizes and a GGUF keeps in its blocks. Others (MoE routers, norms) stay as stored.
# q, q_a, kv_a, kv_b: DeepSeek MLA; in_proj, out: the recurrent layers' projections (gated DeltaNet,
# Mamba-2, LFM2's short conv); up: Nemotron-H's relu² MLP.
LINEAR_PARAMS = frozenset({"qkv", "o", "gate_up", "down", "q", "q_a", "kv_a", "kv_b", "in_proj", "out", "up"})
Role = Literal["linear", "head", "other"]


def is_head(name: str) -> bool:
    """The token embedding or the LM head (HF names)."""
    return name.endswith(HEAD_NAMES)


def block_type(qtype: str, shape: tuple[int, ...], head: bool) -> str | None:
    """The GGUF type a dense matrix of `shape` becomes under a block `--isq` (`qtype`: a value of
    BLOCK_TYPES); None: it stays dense."""
    if len(shape) != 2:
        return None
    want = HEAD_TYPE if head else qtype
    for candidate in (want, FALLBACK.get(want, want), HEAD_TYPE):
        if shape[1] % BLOCKS[candidate].values == 0:
            return candidate
    return None


def isq_bytes(isq: str, role: Role, shape: tuple[int, ...], dense_bytes: int) -> int:
    """Bytes a dense tensor (`dense_bytes` as stored) takes once loaded under `--isq isq`; a 3-D linear is
    stacked experts, each quantized as its own matrix (weights/experts.py splits them)."""
    if role == "other":
        return dense_bytes
    if len(shape) == 3 and role == "linear":
        return shape[0] * isq_bytes(isq, role, shape[1:], dense_bytes // shape[0])
    head = role == "head"
    if isq in BLOCK_TYPES:
        qtype = block_type(BLOCK_TYPES[isq], shape, head)
        if qtype is None:
            return dense_bytes
        values, size = BLOCKS[qtype].values, BLOCKS[qtype].size
        return loaded_block_bytes(qtype, shape[0], shape[1], shape[0] * (shape[1] // values) * size)
    int4 = isq == "q4" and len(shape) == 2 and not head
    if int4 and shape[0] % INT4_ROWS == 0 and shape[1] % INT4_GROUP == 0:
        return int(shape[0] * shape[1] * INT4_BITS) // 8
    return dense_bytes
