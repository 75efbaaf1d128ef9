"""Which sampling values a request gets for the fields it leaves out.

Precedence, per field: the request's own value > the server's flag (--temperature, ...) > the model's
own recommendation (generation_config.json, or a GGUF's general.sampling.* keys) > the built-in
defaults below. Plain temperature 1.0 with no truncation lets a small model drift into garbage that
never ends (SmolLM2 wrote 4,096 tokens of one repeated glyph for a haiku); these values are the ones
llama.cpp and Ollama ship, which keep small models on track and cost big ones nothing noticeable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# Keys a model may recommend (a generation_config.json or GGUF sampling field maps onto these).
MODEL_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Keys a request or a flag may set.
REQUEST_KEYS = (*MODEL_KEYS, "frequency_penalty", "presence_penalty")

BUILTIN_DEFAULTS: dict[str, float | int] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repetition_penalty": 1.05,
}

# llama.cpp's GGUF keys for a model's recommended sampling (written by its converter from
# generation_config.json), mapped onto the names above.
GGUF_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


def resolve(
    requested: Mapping[str, Any], flags: Mapping[str, Any], model: Mapping[str, Any]
) -> dict[str, Any]:
    """The sampling fields for one request. None in any layer means "not set there"."""
    values: dict[str, Any] = dict(BUILTIN_DEFAULTS)
    values.update({k: v for k, v in model.items() if k in MODEL_KEYS and v is not None})
    values.update({k: v for k, v in flags.items() if k in REQUEST_KEYS and v is not None})
    values.update({k: v for k, v in requested.items() if k in REQUEST_KEYS and v is not None})
    explicit_penalty = any(layer.get("repetition_penalty") is not None for layer in (requested, flags, model))
    if values.get("temperature") == 0 and not explicit_penalty:
        # Greedy decoding asks for the model's single best answer; a penalty nobody chose would change it.
        values.pop("repetition_penalty", None)
    return values


def gguf_sampling_defaults(get: Callable[[str], Any]) -> dict[str, Any]:
    """A GGUF's recommended sampling values; `get(key)` returns the metadata value or None."""
    found: dict[str, Any] = {}
    for key, name in GGUF_SAMPLING_KEYS.items():
        value = get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        # GGUF stores float32: 0.95 reads back as 0.949999988; seven digits give back the written value.
        found[name] = int(value) if name == "top_k" else float(f"{value:.7g}")
    return found
