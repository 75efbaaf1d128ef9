"""Vector post-processing the API asks for: Matryoshka truncation (`dimensions`) and base64 output."""

from __future__ import annotations

import base64

import numpy as np

from localchat.errors import InvalidRequestError


def truncate(vectors: np.ndarray, dimensions: int | None, size: int) -> np.ndarray:
    """Keep the first `dimensions` components and L2-normalise again (how Matryoshka-trained models
    are meant to be shortened). `size` is the model's full dimension: asking for more is a 400."""
    if dimensions is None or dimensions == size:
        return vectors
    if not 1 <= dimensions <= size:
        raise InvalidRequestError(
            f"'dimensions' must be between 1 and this model's size ({size}), got {dimensions}.",
            param="dimensions",
        )
    cut = vectors[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return (cut / np.maximum(norms, 1e-12)).astype(np.float32)


def encode(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI sends it
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return [float(x) for x in vector]
