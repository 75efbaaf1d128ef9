"""Whether a draft model can propose tokens for a target (speculative decoding, engine/draft_model.py):
token ids pass between them unchanged, so both tokenizers must give every id the same string and agree
on the special ids. Checked once at load; a mismatch is a typed error naming both models."""

from __future__ import annotations

from localchat.errors import ModelLoadError
from localchat.weights.tokenizer import Tokenizer


class DraftVocabularyError(ModelLoadError):
    code = "draft_vocabulary_mismatch"


def check_draft_vocabulary(target: Tokenizer, draft: Tokenizer, target_name: str, draft_name: str) -> None:
    problem = _difference(target, draft)
    if problem:
        raise DraftVocabularyError(
            f"The draft model {draft_name} cannot speculate for {target_name}: {problem}. A draft model "
            "needs the target's exact vocabulary (the same family and tokenizer, e.g. Qwen2.5-0.5B for "
            "Qwen2.5-7B); pick another --draft-model or use --speculative ngram."
        )


def _difference(target: Tokenizer, draft: Tokenizer) -> str:
    """The first way the two vocabularies differ, in words ("" when they are the same)."""
    if target.vocab_size != draft.vocab_size:
        return f"its vocabulary has {draft.vocab_size} tokens, the target's {target.vocab_size}"
    target_vocab = target.backend.get_vocab(with_added_tokens=True)
    draft_vocab = draft.backend.get_vocab(with_added_tokens=True)
    if target_vocab != draft_vocab:
        token = next(
            t for t in sorted(target_vocab.keys() | draft_vocab.keys())
            if target_vocab.get(t) != draft_vocab.get(t)
        )  # fmt: skip
        return (
            f"token {token!r} is id {draft_vocab.get(token)} there, {target_vocab.get(token)} in the target"
        )
    if target.bos_token_id != draft.bos_token_id or set(target.eos_token_ids) != set(draft.eos_token_ids):
        return (
            f"its BOS/EOS ids are {draft.bos_token_id}/{draft.eos_token_ids}, "
            f"the target's {target.bos_token_id}/{target.eos_token_ids}"
        )
    if target.all_special_ids != draft.all_special_ids:
        return "its special tokens differ from the target's"
    return ""
