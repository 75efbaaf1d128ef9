"""Incremental detokenizer: deltas concatenate to decode(all ids); no broken UTF-8; stop strings cut."""

from __future__ import annotations

import pytest

from localchat.backends.fake import FakeTokenizer
from localchat.engine.detokenizer import IncrementalDetokenizer

TOK = FakeTokenizer()  # one token per byte: every multi-byte character spans several tokens


def stream(text: str, **kwargs: object) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(TOK, **kwargs)  # type: ignore[arg-type]
    deltas = [detok.push([t]) for t in TOK.encode(text)]
    deltas.append(detok.flush())
    return deltas, detok


@pytest.mark.parametrize(
    "text", ["plain ascii", "héllo wörld", "emoji 🎉🧪 and 中文字符", "ok\n\n  \t end", ""]
)
def test_deltas_concatenate_to_the_full_decode_and_never_split_a_character(text: str) -> None:
    deltas, _ = stream(text)
    assert "".join(deltas) == TOK.decode(TOK.encode(text))
    assert all("\ufffd" not in d for d in deltas)


def test_a_trailing_partial_character_is_flushed_as_decode_shows_it() -> None:
    ids = TOK.encode("ab🎉")[:-1]  # cut inside the emoji
    detok = IncrementalDetokenizer(TOK)
    text = "".join(detok.push([i]) for i in ids) + detok.flush()
    assert text == TOK.decode(ids)


def test_stop_string_across_tokens_is_cut_and_not_emitted() -> None:
    deltas, detok = stream("Hello END of story", stop=["END"])
    assert "".join(deltas) == "Hello "
    assert detok.stop_hit == "END"


def test_text_that_may_start_a_stop_string_is_held_back_then_released() -> None:
    detok = IncrementalDetokenizer(TOK, stop=["STOP"])
    out = [detok.push([t]) for t in TOK.encode("a ST")]
    assert "".join(out) == "a "  # "ST" could begin "STOP"
    assert detok.push(TOK.encode("x")) == "STx"  # it did not


def test_earliest_stop_wins_and_include_stop_keeps_it() -> None:
    deltas, detok = stream("one two three", stop=["three", "two"], include_stop_str_in_output=True)
    assert "".join(deltas) == "one two" and detok.stop_hit == "two"


def test_multibyte_stop_string() -> None:
    deltas, _ = stream("price: 5€ only", stop=["€"])
    assert "".join(deltas) == "price: 5"


def test_special_tokens_are_skipped_by_default() -> None:
    ids = TOK.encode("hi<|im_end|>")
    detok = IncrementalDetokenizer(TOK)
    assert "".join(detok.push([i]) for i in ids) + detok.flush() == "hi"
