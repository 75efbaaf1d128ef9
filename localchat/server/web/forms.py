"""Reading the UI's forms: per-conversation settings, checked before they reach a conversation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localchat.engine.sampling_params import SamplingParams
from localchat.errors import InvalidRequestError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from localchat.chats.conversations import ChatService

MAX_SYSTEM_PROMPT_CHARS = 50_000
_LABELS = {"temperature": "Temperature", "top_p": "Top P", "max_tokens": "Max tokens"}


def parse_settings(form: Mapping[str, Any], chats: ChatService) -> dict[str, Any] | None:
    """The settings fields a form holds (None when it has none). An empty field means "the model's default"."""
    settings: dict[str, Any] = {}
    if "system_prompt" in form:
        settings["system_prompt"] = str(form.get("system_prompt", "")).strip()
        if len(settings["system_prompt"]) > MAX_SYSTEM_PROMPT_CHARS:
            raise InvalidRequestError(
                f"The system prompt is longer than {MAX_SYSTEM_PROMPT_CHARS:,} characters."
            )
    for key, kind in (("temperature", float), ("top_p", float), ("max_tokens", int)):
        if key in form:
            settings[key] = _number(form, key, kind)
    if not settings:
        return None
    defaults = chats.model_defaults()
    merged = {key: defaults[key] if settings.get(key) is None else settings[key] for key in _LABELS}
    try:
        SamplingParams(**merged)  # the same checks the engine's edge applies, with the user's words for it
    except InvalidRequestError as exc:
        name = _LABELS.get(exc.param or "", exc.param)
        raise InvalidRequestError(f"{name}: {exc.message}", param=exc.param) from exc
    return settings


def _number(form: Mapping[str, Any], key: str, kind: type[int] | type[float]) -> Any:
    text = str(form.get(key, "")).strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise InvalidRequestError(f"{_LABELS[key]} must be a number, got {text!r}.", param=key) from None
