"""localchat: a local LLM chat app. `from localchat import LLM` for the library API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from localchat.engine.sampling_params import SamplingParams
    from localchat.llm import LLM

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: `import localchat` stays cheap (the CLI's --help must not load the engine).
    if name == "LLM":
        from localchat.llm import LLM

        return LLM
    if name == "SamplingParams":
        from localchat.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
