"""Chat templates: a sandboxed Jinja2 renderer that matches Hugging Face's `apply_chat_template(tokenize=False)`.

The template sees what HF gives it: `messages`, `tools`, `documents`, `add_generation_prompt`, the special
tokens (`bos_token`, `eos_token`) and any extra keyword (`enable_thinking`, `date_string`, ...), plus the
globals `raise_exception`, `strftime_now`, a restricted `dict` and `namespace`, and HF's `tojson` filter.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any, NoReturn

from jinja2 import TemplateError, TemplateSyntaxError, meta, nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from localchat.errors import InvalidRequestError, ModelLoadError

# Used when a model ships no template. Content that is not a string (e.g. image parts) is left out.
CHATML_FALLBACK = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content if message.content is string else '')"
    " + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# HF copies a message's reasoning under every name templates read it by; the first one found wins.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class _TemplateRefused(TemplateError):
    """Raised by `raise_exception()`: the template rejects the conversation (a user error)."""


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRefused(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes `<`, `>`, `&`, `'`; prompts must keep the characters as they are.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _DictFactory:
    """`dict(...)` for templates without handing them the `dict` type itself (and its class attributes)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Iterable[Any], value: Any = None) -> dict[Any, Any]:
        return dict.fromkeys(keys, value)


class _SafeNamespace(Namespace):
    """`namespace()` that refuses underscore names, so templates cannot shadow or reach Python internals."""

    def __init__(self, /, *args: Any, **kwargs: Any) -> None:
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        Namespace.__setitem__(self, name, value)


def _check_namespace_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"chat templates may not set the namespace attribute {name!r}")


class _GenerationTag(Extension):
    """HF's `{% generation %}...{% endgeneration %}` marks assistant spans for training masks; we render the body."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's Extension API declares tags as a class-level set)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


_ENV = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _GenerationTag]
)
_ENV.filters["tojson"] = _tojson
_ENV.globals |= {
    "raise_exception": _raise_exception,
    "strftime_now": lambda fmt: datetime.now().strftime(fmt),
    "dict": _DictFactory(),
    "namespace": _SafeNamespace,
}


@lru_cache(maxsize=16)
def _compile(source: str) -> tuple[Any, frozenset[str]]:
    try:
        ast = _ENV.parse(source)
        return _ENV.from_string(ast), frozenset(meta.find_undeclared_variables(ast))
    except TemplateError as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, TemplateSyntaxError) else ""
        raise ModelLoadError(
            f"The model's chat template is not valid Jinja{where}: {exc.message}. "
            "Fix the template in the model's tokenizer_config.json / GGUF metadata, or supply another one."
        ) from exc


def _plain(value: Any) -> Any:
    """A copy made only of JSON-like types, so no object with exotic methods ever reaches the sandbox."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (str enums) lose their extra methods
        return str.__str__(value)
    if isinstance(value, int | float):
        return float(value) if isinstance(value, float) else int(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [_plain(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return f"<{type(value).__name__}>"


def _prepare(message: Mapping[str, Any], flatten_content: bool) -> dict[str, Any]:
    # Like HF, drop None-valued keys: templates test for a missing key but would print a literal "None".
    msg = {key: _plain(val) for key, val in message.items() if val is not None}
    reasoning = next((msg[k] for k in _REASONING_KEYS if k in msg), None)
    if reasoning is not None:
        msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
    if flatten_content and isinstance(parts := msg.get("content"), list):
        texts = [
            p["text"]
            for p in parts
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        ]
        if len(texts) == len(parts):
            msg["content"] = "\n".join(texts)
    return msg


class ChatTemplate:
    """A model's chat template, compiled once (and cached by source text) and rendered per request.

    `source=None` (or blank) selects `CHATML_FALLBACK`, a plain ChatML template for models that ship none;
    `is_fallback` tells the caller so. `bos_token`/`eos_token` are the tokenizer's, passed like HF's
    `special_tokens_map` (only when set).
    """

    def __init__(
        self, source: str | None, *, bos_token: str | None = None, eos_token: str | None = None
    ) -> None:
        self.is_fallback = not (source and source.strip())
        self.source = CHATML_FALLBACK if self.is_fallback else str(source)
        self.bos_token, self.eos_token = bos_token, eos_token
        self._template, self.variables = _compile(self.source)

    @property
    def renders_tools(self) -> bool:
        """Whether the template reads `tools` (else tool definitions would silently vanish from the prompt)."""
        return "tools" in self.variables

    @property
    def supports_thinking(self) -> bool:
        """Whether the template reads `enable_thinking` (Qwen3-style reasoning switch)."""
        return "enable_thinking" in self.variables

    def render(
        self,
        messages: Iterable[Mapping[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        bos_token: str | None = None,
        eos_token: str | None = None,
        flatten_content: bool = True,
        **extra: Any,
    ) -> str:
        """The prompt text for `messages`, exactly as `apply_chat_template(..., tokenize=False)` renders it.

        `tools` are OpenAI tool dicts (`{"type": "function", "function": {...}}`), passed through unchanged,
        as HF does. `extra` keywords (`enable_thinking`, `date_string`, ...) reach the template as variables.
        `flatten_content` (our addition; HF passes content-part lists through unchanged): a `content` list
        whose parts are all `{"type": "text"}` becomes their texts joined by newlines, because most
        templates concatenate `content` as a string and would otherwise print a Python list or fail.
        Parts of any other type keep the list as is, for templates that handle multimodal content.
        """
        special = {
            "bos_token": self.bos_token if bos_token is None else bos_token,
            "eos_token": self.eos_token if eos_token is None else eos_token,
        }
        context = {k: v for k, v in special.items() if v is not None} | extra  # extra wins, like HF
        chat = [_prepare(message, flatten_content) for message in messages]
        try:
            return self._template.render(
                messages=chat,
                tools=_plain(tools),
                documents=_plain(documents),
                add_generation_prompt=add_generation_prompt,
                **_plain(context),
            )
        except _TemplateRefused as exc:
            raise InvalidRequestError(
                str(exc) or "The chat template rejected the conversation.", param="messages"
            ) from None
        except SecurityError as exc:
            raise InvalidRequestError(
                f"The chat template attempted an unsafe operation and was stopped: {exc}"
            ) from exc
        except Exception as exc:  # the template is foreign code: any failure is this conversation's shape
            raise InvalidRequestError(
                f"The model's chat template could not render this conversation ({type(exc).__name__}: {exc}). "
                "Check that each message has the fields and roles this model expects.",
                param="messages",
            ) from exc

    @cached_property
    def generation_prompt(self) -> str | None:
        """What `add_generation_prompt=True` appends (e.g. "<|im_start|>assistant\\n"); None if unknown."""
        probe = [{"role": "user", "content": "x"}]
        with_prompt, without = self._probe(probe, True), self._probe(probe, False)
        if with_prompt is None or without is None or not with_prompt.startswith(without):
            return None
        return with_prompt[len(without) :]

    @cached_property
    def end_of_turn(self) -> str | None:
        """The text that closes an assistant turn (e.g. "<|im_end|>"), a natural stop string; None if unknown."""
        mark = "\x00turn\x00"
        text = self._probe([{"role": "user", "content": "x"}, {"role": "assistant", "content": mark}], False)
        return (text.rpartition(mark)[2].strip() or None) if text and mark in text else None

    def _probe(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str | None:
        try:
            return self.render(messages, add_generation_prompt=add_generation_prompt)
        except InvalidRequestError:
            return None
