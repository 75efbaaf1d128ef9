"""The chat page's extras: example prompts on an empty chat, the global default system prompt and the
saved presets (sampling + system prompt) that the settings dialog applies."""

from __future__ import annotations

# (title, prompt): shown as buttons on an empty chat; a click sends the prompt. Everyday tasks a small
# local model answers well, so a first try shows what it can do.
EXAMPLE_PROMPTS: list[tuple[str, str]] = [
    ("Write a haiku", "Write a haiku about tea."),
    ("Explain a concept", "Explain what a hash table is, in three short paragraphs."),
    ("Write some code", "Write a Python function that checks whether a string is a palindrome."),
    ("Plan something", "Give me a packing list for a weekend hiking trip."),
]
