"""Gemma 3's image tokens in a rendered prompt, as transformers' Gemma3Processor writes them: each
`<start_of_image>` the chat template emits becomes "\\n\\n<start_of_image>" + mm_tokens_per_image image
tokens + "<end_of_image>\\n\\n" in the text before tokenizing; the image tokens' positions in the token ids
are where the runner scatters each picture's embedding rows."""

from __future__ import annotations

from dataclasses import dataclass

BOI = "<start_of_image>"
EOI = "<end_of_image>"
IMAGE = "<image_soft_token>"


@dataclass(frozen=True, slots=True)
class ImageTokens:
    tokens_per_image: int  # config.json mm_tokens_per_image
    image_token_id: int  # config.json image_token_index

    def expand(self, prompt_text: str) -> str:
        """Every image start marker -> the full image sequence (the processor's string replacement)."""
        return prompt_text.replace(BOI, f"\n\n{BOI}{IMAGE * self.tokens_per_image}{EOI}\n\n")

    def placeholders(self, token_ids: list[int]) -> list[tuple[int, ...]]:
        """Positions of each picture's image tokens, one run of tokens_per_image per picture, in order.
        ValueError when a run is cut short (a prompt that truncation or a template broke)."""
        positions = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        n = self.tokens_per_image
        runs = [tuple(positions[k : k + n]) for k in range(0, len(positions), n)]
        for run in runs:
            if len(run) != n or run[-1] - run[0] != n - 1:
                raise ValueError(f"an image needs {n} consecutive image tokens in the prompt")
        return runs
