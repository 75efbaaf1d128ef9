"""Where an image's embedding rows go in a prefill that chunked prefill may split: the image is encoded
whole once, and each chunk takes the slice of rows whose placeholder positions fall inside it."""

from __future__ import annotations


def chunk_rows(placeholders: list[int], start: int, end: int) -> tuple[list[int], list[int]]:
    """Placeholder token positions of one image and a chunk [start, end) of the prompt -> (rows within the
    chunk, the matching rows of the image's embeddings)."""
    picked = [(pos - start, i) for i, pos in enumerate(placeholders) if start <= pos < end]
    return [p for p, _ in picked], [i for _, i in picked]
