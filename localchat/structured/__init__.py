"""Structured output: JSON Schema, json_object and forced tool calls compiled into grammars (llguidance)
that the engine turns into a per-step token mask. See docs/architecture.md, "Constrained decoding"."""
