"""The library API: `LLM(path).generate(...)`, `.chat(...)`, `.stream(...)`, driving the engine in the
caller's thread (no server, no engine thread)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from localchat.backend_settings import resolve_backend_variables
from localchat.backends import RunnerOptions, load_runner
from localchat.engine.config import EngineConfig
from localchat.engine.interface import TokenLogprobs
from localchat.engine.sampling_params import SamplingParams
from localchat.serving.assembly import engine_for
from localchat.serving.chat_render import chat_tokens
from localchat.serving.draft_model import draft_runner_for, eagle_proposer_for
from localchat.serving.mtp import mtp_for_method

Messages = list[dict[str, Any]]
SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(slots=True)
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    logprobs: list[TokenLogprobs] = field(default_factory=list)


class LLM:
    """Load a model (GGUF file, safetensors folder or models.yaml alias) and generate with it.

    >>> llm = LLM("SmolLM2-135M-Instruct.Q4_1.gguf")
    >>> llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0)).text
    """

    def __init__(
        self,
        model: str | Path,
        *,
        backend: str = "auto",
        device: str = "auto",
        dtype: str = "auto",
        engine_config: EngineConfig | None = None,
        seed: int = 0,
        kv_cache_dtype: str = "auto",
        speculative: str | None = None,
        draft_model: str | Path | None = None,
    ) -> None:
        """`speculative` (off, ngram, draft, eagle, mtp, auto) overrides `engine_config.speculative.method`, as
        the server's --speculative (auto: picked for the model and device at load); `draft_model`: the
        draft model (a models.yaml name, GGUF file or folder) of `draft`, or the EAGLE-3 head's folder of
        `eagle` (docs/speculative.md)."""
        from localchat.weights.chat_template import ChatTemplate
        from localchat.weights.loader import load_model

        # The backend variables first: a wrong one fails before the weights are read
        backend_settings = resolve_backend_variables()
        self.model = load_model(model)
        options = RunnerOptions(
            device=device,
            dtype=dtype,
            seed=seed,
            kv_cache_dtype=kv_cache_dtype,
            backend_settings=backend_settings,
        )
        self.runner = load_runner(backend, self.model, options)
        config = engine_config or EngineConfig()
        if speculative is not None:
            config = replace(config, speculative=replace(config.speculative, method=speculative))
        config.validate()
        draft = str(draft_model) if draft_model else None
        method, name = config.speculative.method, self.model.name
        draft_runner = (
            draft_runner_for(draft, backend, self.model, name, options) if method == "draft" else None
        )
        proposer = eagle_proposer_for(draft, self.runner, self.model, name) if method == "eagle" else None
        if method in ("mtp", "auto"):  # the model's own head (auto: when its files carry one)
            proposer = mtp_for_method(method, self.runner, self.model, name)
        self.engine = engine_for(self.model, self.runner, config, draft_runner, proposer)
        self.tokenizer = self.model.tokenizer
        self.template = ChatTemplate(self.model.chat_template)

    def default_params(self, **overrides: Any) -> SamplingParams:
        defaults = {k: v for k, v in self.model.generation_defaults.items() if k in SAMPLING_DEFAULT_KEYS}
        return SamplingParams(**{**defaults, **overrides})

    def apply_chat_template(
        self, messages: Messages, tools: list[dict] | None = None, **kwargs: Any
    ) -> list[int]:
        return chat_tokens(self.template, self.tokenizer, messages, tools, **kwargs)[1]

    def generate(
        self, prompts: str | Sequence[str] | Sequence[list[int]], params: SamplingParams | None = None
    ) -> list[Completion]:
        """Run every prompt to completion, batched together; results in input order."""
        if isinstance(prompts, str):
            prompts = [prompts]
        ids = [p if isinstance(p, list) else self.tokenizer.encode(p) for p in prompts]
        return self._run(ids, params or self.default_params())

    def chat(
        self, messages: Messages, params: SamplingParams | None = None, **template_kwargs: Any
    ) -> Completion:
        return self._run(
            [self.apply_chat_template(messages, **template_kwargs)], params or self.default_params()
        )[0]

    def stream(self, prompt: str | Messages, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text deltas as they are generated. Breaking out of the loop aborts the request."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else self.apply_chat_template(prompt)
        req_id = self.engine.add_request(ids, params or self.default_params())
        finished = False
        try:
            while not finished:
                for out in self.engine.step():
                    if out.req_id == req_id:
                        finished = out.finished
                        if out.text_delta:
                            yield out.text_delta
        finally:
            if not finished:
                self.engine.abort_request(req_id)

    def _run(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Completion]:
        req_ids = [self.engine.add_request(ids, params) for ids in prompt_ids]
        results: dict[str, Completion] = {r: Completion("", [], "", 0, 0) for r in req_ids}
        while any(not results[r].finish_reason for r in req_ids):
            for out in self.engine.step():
                done = results.get(out.req_id)
                if done is None:
                    continue
                done.text += out.text_delta
                done.token_ids += out.new_token_ids
                done.logprobs += out.logprobs
                if out.finished:
                    done.finish_reason = str(out.finish_reason)
                    done.prompt_tokens, done.cached_tokens = out.num_prompt_tokens, out.num_cached_tokens
        return [results[r] for r in req_ids]
