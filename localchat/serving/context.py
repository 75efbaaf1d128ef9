"""What every route handler needs, created once per app: the engine, the model and its template.

Handlers get it from the model manager (`server/common.py: model_context`), one per loaded model.
Chat prompts come from `serving/chat_render.py`, so every caller tokenizes conversations the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localchat import __version__
from localchat.serving.chat_render import chat_tokens
from localchat.serving.logprobs import TokenTexts
from localchat.serving.responses_store import ResponseStore
from localchat.serving.tool_parsers import JsonParser, ToolParser

if TYPE_CHECKING:
    from localchat.config import Settings
    from localchat.engine.async_engine import AsyncEngine
    from localchat.mcp import McpHub
    from localchat.weights.bundle import ModelBundle
    from localchat.weights.chat_template import ChatTemplate


@dataclass(slots=True)
class ServerContext:
    settings: Settings
    engine: AsyncEngine
    model: ModelBundle
    model_id: str  # the id clients pass as `model` and see in /v1/models
    template: ChatTemplate
    model_aliases: list[str] = field(default_factory=list)  # other names accepted as `model`
    backend_name: str = "unknown"  # the resolved backend (torch, mlx, fake)
    tool_parser: ToolParser = field(default_factory=JsonParser)  # the model's tool-call format
    responses: ResponseStore = field(default_factory=ResponseStore)  # for previous_response_id
    mcp: McpHub | None = None  # the servers of --mcp-config
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False  # set on SIGINT/SIGTERM: new requests get 503, in-flight ones finish
    _token_texts: TokenTexts | None = None

    @property
    def system_fingerprint(self) -> str:
        return f"localchat-{__version__}-{self.backend_name}"

    @property
    def token_texts(self) -> TokenTexts:
        """Single-token texts and bytes for logprobs, cached for the model's lifetime."""
        if self._token_texts is None:
            self._token_texts = TokenTexts(self.model.tokenizer)
        return self._token_texts

    def knows_model(self, name: str | None) -> bool:
        # An empty or missing `model` means the one loaded model (lenient, like most local servers).
        return not name or name == self.model_id or name in self.model_aliases

    def chat_tokens(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> tuple[str, list[int]]:
        """(prompt text, token ids) of a conversation; keywords as `serving.chat_render.chat_tokens`."""
        return chat_tokens(self.template, self.model.tokenizer, messages, tools, **kwargs)

    def encode_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> list[int]:
        return self.chat_tokens(messages, tools, **kwargs)[1]
