"""What every route handler needs, created once per app: the engine, the model and its template.

Handlers reach it as `request.app.state.ctx` (see app.py). Chat prompts are built here so the API
and the web UI tokenize conversations the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localchat.config import Settings
    from localchat.engine.async_engine import AsyncEngine
    from localchat.weights.bundle import ModelBundle
    from localchat.weights.chat_template import ChatTemplate


@dataclass(slots=True)
class ServerContext:
    settings: Settings
    engine: AsyncEngine
    model: ModelBundle
    model_id: str  # the id clients pass as `model` and see in /v1/models
    template: ChatTemplate

    def encode_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> list[int]:
        tokenizer = self.model.tokenizer
        text = self.template.render(
            messages,
            tools=tools,
            add_generation_prompt=True,
            bos_token=tokenizer.bos_token or "",
            eos_token=tokenizer.eos_token or "",
            **kwargs,
        )
        return tokenizer.encode(text, add_special_tokens=False)
