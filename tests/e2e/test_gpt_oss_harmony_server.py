"""A tiny random gpt-oss folder through the real server (torch, float32) and the official openai
client: its harmony chat template picks the harmony reader, the reply is decoded with its special
tokens, and the server's reasoning_content/content equal the harmony split of transformers' own greedy
tokens for the same prompt. `reasoning_effort` and tool results reach the prompt.

The tokenizer is a small byte-level one with gpt-oss's harmony special tokens (the real o200k_harmony
vocabulary is not available offline), and the chat template is a minimal harmony template written for
this test (system with `Reasoning: <effort>`, tools, user, assistant final and tool-call turns, tool
results as `functions.NAME to=assistant` messages), not the model card's."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, GptOssConfig, PreTrainedTokenizerFast

from localchat.serving.harmony import split_harmony
from tests.backends.test_gpt_oss import TINY
from tests.helpers.live_server import live_server

pytestmark = pytest.mark.slow

SPECIALS = [
    "<|endoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
]
HARMONY_TEMPLATE = """\
{%- set effort = reasoning_effort if reasoning_effort is defined else "medium" -%}
<|start|>system<|message|>Reasoning: {{ effort }}
# Valid channels: analysis, commentary, final.<|end|>
{%- if tools %}<|start|>developer<|message|># Tools
namespace functions {
{%- for t in tools %}
type {{ t.function.name }} = (_: any) => any;
{%- endfor %}
}<|end|>{% endif -%}
{%- set last = namespace(name=none) -%}
{%- for m in messages -%}
{%- if m.role == "system" or m.role == "developer" %}<|start|>developer<|message|>{{ m.content }}<|end|>
{%- elif m.role == "user" %}<|start|>user<|message|>{{ m.content }}<|end|>
{%- elif m.role == "assistant" and m.tool_calls %}
{%- for c in m.tool_calls %}{% set f = c.function if c.function is defined else c -%}
<|start|>assistant to=functions.{{ f.name }}<|channel|>commentary json<|message|>{{ f.arguments | tojson }}<|call|>
{%- set last.name = f.name %}{% endfor %}
{%- elif m.role == "assistant" %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- elif m.role == "tool" %}<|start|>functions.{{ last.name }} to=assistant<|channel|>commentary<|message|>\
{{ m.content | tojson }}<|end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|start|>assistant{% endif -%}
"""
MAX_TOKENS = 12
# The weights make the reply a chain of next tokens (each token picks the next), so greedy decoding
# writes a known harmony message: `<|channel|>analysis<|message|>ok` then the stop token.
CHAIN = ["t", "<|channel|>", "analysis", "<|message|>", "o", "k", "<|return|>"]  # "t": the prompt's last
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}},
}


def write_folder(folder: Path) -> tuple[PreTrainedTokenizerFast, torch.nn.Module]:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.add_tokens(["analysis"])  # one token, as in o200k_harmony
    eos = [tok.token_to_id(t) for t in ("<|return|>", "<|call|>", "<|endoftext|>")]
    torch.manual_seed(0)
    config = GptOssConfig(**{**TINY, "vocab_size": 272, "eos_token_id": eos, "bos_token_id": None})
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith(("o_proj.weight", "o_proj.bias", "down_proj", "down_proj_bias")):
                param.zero_()  # every layer adds nothing: the last hidden state is the token's embedding
            elif name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(0.15 * torch.randn_like(param))
        embed, head = hf.get_input_embeddings().weight, hf.get_output_embeddings().weight
        head.mul_(0.01)
        ids = [tok.token_to_id(t) for t in CHAIN]
        for prev, nxt in itertools.pairwise(ids):
            head[nxt] = 5.0 * embed[prev] / embed[prev].norm()
    hf.generation_config.eos_token_id = eos
    hf.save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": HARMONY_TEMPLATE, "eos_token": "<|return|>", "bos_token": None})
    )
    return PreTrainedTokenizerFast.from_pretrained(folder), hf


def transformers_reply(
    tok: PreTrainedTokenizerFast, hf: torch.nn.Module, messages: list[dict[str, Any]]
) -> str:
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)  # type: ignore[operator]
    return str(tok.decode(out[0, len(ids) :].tolist(), skip_special_tokens=False))


def test_gpt_oss_folder_answers_in_channels_through_the_server(tmp_path: Path) -> None:
    folder = tmp_path / "gpt-oss-tiny"
    tok, hf = write_folder(folder)
    hi = [{"role": "user", "content": "Hi"}]
    expected = transformers_reply(tok, hf, hi)
    assert expected == "<|channel|>analysis<|message|>ok<|return|>"
    args = ["--w", str(folder), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    with live_server(args) as server:
        client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0].id

        def ask(messages: list[Any], **kw: Any) -> Any:
            kw.setdefault("max_tokens", MAX_TOKENS)
            return client.chat.completions.create(model=model, messages=messages, temperature=0, **kw)

        reply = ask(hi)
        message = reply.choices[0].message
        # skipping the special tokens would have given content "analysisok"
        assert ((message.model_extra or {}).get("reasoning_content"), message.content) == ("ok", "")
        assert split_harmony(expected) == ("ok", "")
        reasoning = "".join(
            (c.delta.model_extra or {}).get("reasoning_content") or ""
            for chunk in ask(hi, stream=True)
            for c in chunk.choices
        )
        assert reasoning == "ok"

        def prompt_tokens(messages: list[Any], **kw: Any) -> int:
            return int(ask(messages, max_tokens=1, **kw).usage.prompt_tokens)

        # "Reasoning: <effort>" in the system message, one byte-level token per character
        low = prompt_tokens(hi, reasoning_effort="low")
        assert prompt_tokens(hi, reasoning_effort="high") == low + 1
        assert prompt_tokens(hi) == low + 3  # the template's default, "medium"
        answer = client.responses.create(
            model=model, input="Hi", reasoning={"effort": "high"}, max_output_tokens=4
        )
        assert answer.usage is not None and answer.usage.input_tokens == low + 1
        assert [item.type for item in answer.output][:1] == ["reasoning"]

        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}

        def with_result(result: str) -> list[Any]:
            return [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": result},
            ]

        # the server hands the template the arguments parsed (the real template writes them |tojson)
        as_template_sees = with_result("sunny")
        as_template_sees[1] = {
            **as_template_sees[1],
            "tool_calls": [{**call, "function": {"name": "get_weather", "arguments": {}}}],
        }
        rendered = tok.apply_chat_template(
            as_template_sees,
            tools=[WEATHER],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        assert prompt_tokens(with_result("sunny"), tools=[WEATHER]) == len(rendered)
        assert prompt_tokens(with_result("sunny!"), tools=[WEATHER]) == len(rendered) + 1
