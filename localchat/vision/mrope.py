"""M-RoPE positions (Qwen2-VL family): a text token turns by one position each, as usual; an image's tokens
take (frame, row, column) positions of its merged grid, all three offset by where the image starts, and the
text after it continues from that start + the grid's longest side. So every token after an image sits at
its index + a "rope delta" (negative: an image of R x C tokens advances the positions by max(R, C)).

Computed from the request's images alone, for any span of token indices: a prefill chunk that splits an
image's run, decode steps and drafts past the prompt, and prefix-cache hits all get the same positions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localchat.engine.request import ImageInput


def uses_mrope(images: Sequence[ImageInput]) -> bool:
    return any(image.grid is not None for image in images)


def mrope_positions(images: Sequence[ImageInput], start: int, end: int) -> np.ndarray:
    """int64 [3, end - start]: the (temporal, height, width) positions of token indices [start, end)."""
    index = np.arange(start, end, dtype=np.int64)
    out = np.broadcast_to(index, (3, end - start)).copy()
    delta = 0  # the shift of the tokens after the images seen so far
    for image in sorted((i for i in images if i.grid is not None), key=lambda i: i.placeholders[0]):
        assert image.grid is not None
        t, h, w = image.grid
        first = image.placeholders[0]
        count = t * h * w
        base = first + delta  # the image's first position on every axis
        inside = (index >= first) & (index < first + count)
        if inside.any():
            k = index[inside] - first  # the token's place in the image's frame-major, row-major grid
            out[0, inside] = base + k // (h * w)
            out[1, inside] = base + (k // w) % h
            out[2, inside] = base + k % w
        delta += max(h, w) - count
        after = index >= first + count
        out[:, after] = index[after] + delta
    return out
