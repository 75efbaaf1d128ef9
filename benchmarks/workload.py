"""The shared benchmark workload (../shared/reference/perf-anchors.md): 8 prompts sent twice, and a
~480-token chat prompt for single-stream prefill/decode."""

from __future__ import annotations

PROMPTS = [
    "Explain how to best learn Rust.",
    "Please talk about deep learning in 100 words.",
    "Do you know the capital city of China? Talk the details of you known.",
    "Who is the best female actor in the world? Explain why.",
    "How to dealing with depression?",
    "How to make money in short time?",
    "What is the future trend of large language model?",
    "The famous tech companies in the world.",
]
CONCURRENT_PROMPTS = PROMPTS * 2  # 16 requests

_PARAGRAPH = (
    "Large language models are trained on vast amounts of text to predict the next token. During "
    "inference, the prompt is first processed in a prefill phase that fills the key-value cache, and "
    "then tokens are generated one at a time in a decode phase that reads the whole cache each step. "
)


def long_chat_messages(paragraphs: int = 8) -> list[dict[str, str]]:
    """About 480 tokens once templated for SmolLM2 (the anchors' single-stream prompt size)."""
    context = " ".join(_PARAGRAPH for _ in range(paragraphs))
    return [
        {"role": "system", "content": "You are a concise technical assistant."},
        {"role": "user", "content": f"{context}\n\nSummarise the text above, then explain paged attention."},
    ]
