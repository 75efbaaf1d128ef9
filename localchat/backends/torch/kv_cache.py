"""One layer's paged KV cache: a plain tensor in the compute dtype, or int8 codes with scales.

`--kv-cache-dtype`:

| value | element | bytes per token, head and K/V (head_dim d) |
|---|---|---|
| auto | the compute dtype (bfloat16 on CUDA and on CPUs with native bf16, float16 on mps, else float32) | 2d or 4d |
| bf16 | bfloat16 | 2d |
| int8 | int8 code + one float32 scale per (token, head, K/V) | d + 4 |

int8 is symmetric absmax per token and head: scale = max|x| / 127, code = round(x / scale), so each
value is off by at most scale / 2 = max|x| / 254. The scale is float32 rather than 16-bit: it costs 4
of d + 4 bytes (6% at d = 64, 3% at d = 128), and a bf16 scale would add up to 0.4% relative error to
every value of its row on top of the rounding (fp16 would underflow for tiny rows); the C kernel reads
it without conversion.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from localchat.config import KV_CACHE_DTYPES
from localchat.errors import BackendUnavailableError

INT8_MAX = 127


@dataclass(slots=True)
class Int8KVCache:
    """codes int8 [2 (K, V), kv_heads, slots, head_dim]; scales float32 [2, kv_heads, slots]."""

    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def is_contiguous(self) -> bool:
        return self.codes.is_contiguous() and self.scales.is_contiguous()


KVCache = torch.Tensor | Int8KVCache


def kv_element_dtype(choice: str, compute: torch.dtype) -> torch.dtype:
    """The cache's element type for `--kv-cache-dtype` (int8: the codes)."""
    if choice not in KV_CACHE_DTYPES:
        raise BackendUnavailableError(
            f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {choice!r}."
        )
    return {"auto": compute, "bf16": torch.bfloat16, "int8": torch.int8}[choice]


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] -> (codes int8 [..., d], scales float32 [...]): symmetric absmax per row of d."""
    x = x.float()
    scales = x.abs().amax(dim=-1, keepdim=True).div_(INT8_MAX)
    # An all-zero row keeps scale 0 and codes 0 (the floor only avoids 0 / 0; rows whose max is below
    # it, 1.3e-28, would read as zeros).
    codes = x.div(scales.clamp_min(1e-30)).round_().clamp_(-INT8_MAX, INT8_MAX)
    return codes.to(torch.int8), scales.squeeze(-1)


def dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes int8 [..., d], scales [...] -> float32 [..., d]."""
    return codes.float() * scales[..., None]


def write_int8(k: torch.Tensor, v: torch.Tensor, cache: Int8KVCache, slots: torch.Tensor) -> None:
    """Quantize this step's keys/values ([tokens, kv_heads, d]) into their slots: K and V together, so
    a decode step pays each torch op's overhead once per layer, not twice."""
    codes, scales = quantize_rows(torch.stack((k, v)).transpose(1, 2))  # [2, kv_heads, tokens(, d)]
    cache.codes.index_copy_(2, slots, codes)
    cache.scales.index_copy_(2, slots, scales)


def gather_int8(cache: Int8KVCache, block_ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """Blocks `block_ids` in order, dequantized: float32 [2, kv_heads, len(block_ids) * block_size, d]."""
    two, kv_heads, slots, head_dim = cache.codes.shape
    codes = cache.codes.view(two, kv_heads, slots // block_size, block_size * head_dim)
    scales = cache.scales.view(two, kv_heads, slots // block_size, block_size)
    picked = codes.index_select(2, block_ids).view(two, kv_heads, -1, head_dim)
    return dequantize(picked, scales.index_select(2, block_ids).view(two, kv_heads, -1))


def span_int8(cache: Int8KVCache, start: int, end: int) -> torch.Tensor:
    """Slots [start, end) dequantized: float32 [2, kv_heads, end - start, d]."""
    return dequantize(cache.codes[:, :, start:end], cache.scales[:, :, start:end])


def copy_slots(caches: list[KVCache], src: torch.Tensor, dst: torch.Tensor) -> None:
    """Every layer's K/V (codes and scales of an int8 cache) at slots `src` copied to slots `dst`
    (int64, on the caches' device): partial prefix reuse (engine/block_manager.py). In place, so CUDA
    graphs that captured the cache tensors still see them."""
    for cache in caches:
        parts = (cache.codes, cache.scales) if isinstance(cache, Int8KVCache) else (cache,)
        for part in parts:
            part.index_copy_(2, dst, part.index_select(2, src))
