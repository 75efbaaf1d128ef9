"""Our GGUF tokenizers against llama.cpp's own test vectors: every vocabulary-only GGUF llama.cpp keeps
in models/ (real vocabularies of BPE, SentencePiece, WordPiece and Gemma 4 models) must give exactly
the ids in its .out file for every text in its .inp file, special tokens off, as test-tokenizer-0 runs.

Vocabularies llama.cpp ships without vectors still have to load, encode and decode; none is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from localchat.errors import ModelLoadError
from localchat.weights.gguf import open_gguf
from localchat.weights.gguf_pretokenizers import PRE_TOKENIZERS, UnsupportedTokenizerError
from localchat.weights.tokenizer import Tokenizer
from tests.helpers.llama_vocabs import ensure_vocabs, read_vectors
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.slow  # ~1 min: some of these vocabularies hold 250k tokens

WITH_VECTORS = [
    "bert-bge",  # WordPiece
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",  # SentencePiece-shaped BPE (tokenizer.ggml.model = gemma4)
    "gpt-2",
    "llama-bpe",
    "llama-spm",  # SentencePiece BPE
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
]
# No .inp/.out upstream: they must still load and round-trip plain text.
WITHOUT_VECTORS = ["aquila", "baichuan", "gpt-neox", "nomic-bert-moe"]  # nomic-bert-moe: Unigram (t5)
# Vocabularies we refuse, with the reason (none today). A refusal must be a typed error, never wrong ids.
REFUSED: dict[str, str] = {}


@pytest.fixture(scope="module")
def vocab_dir() -> Path:
    return ensure_vocabs()


def test_every_shipped_vocabulary_is_covered(vocab_dir: Path) -> None:
    shipped = {p.name[len("ggml-vocab-") : -len(".gguf")] for p in vocab_dir.glob("ggml-vocab-*.gguf")}
    assert shipped == {*WITH_VECTORS, *WITHOUT_VECTORS, *REFUSED}
    with_vectors = {p.name[len("ggml-vocab-") : -len(".gguf.out")] for p in vocab_dir.glob("*.gguf.out")}
    assert with_vectors == set(WITH_VECTORS)


@pytest.mark.parametrize("name", WITH_VECTORS)
def test_ids_match_llama_cpp(vocab_dir: Path, name: str) -> None:
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    tokenizer = Tokenizer.from_gguf(open_gguf(path))
    wrong = [
        (text, want, got)
        for text, want in read_vectors(path)
        if (got := tokenizer.encode(text, add_special_tokens=False)) != want
    ]
    assert not wrong, f"{len(wrong)} texts differ, first: {wrong[0]}"


@pytest.mark.parametrize("name", WITHOUT_VECTORS)
def test_vocabularies_without_vectors_load_and_round_trip(vocab_dir: Path, name: str) -> None:
    tokenizer = Tokenizer.from_gguf(open_gguf(vocab_dir / f"ggml-vocab-{name}.gguf"))
    ids = tokenizer.encode("Hello world, this is a test.", add_special_tokens=False)
    assert 3 <= len(ids) <= 12
    unk = tokenizer.backend.token_to_id("<unk>")
    assert unk not in ids
    assert tokenizer.decode(ids).strip() == "Hello world, this is a test."


def test_wordpiece_wraps_text_in_cls_and_sep(vocab_dir: Path) -> None:
    tokenizer = Tokenizer.from_gguf(open_gguf(vocab_dir / "ggml-vocab-bert-bge.gguf"))
    ids = tokenizer.encode("Hello World")
    assert [tokenizer.id_to_token(i) for i in ids] == ["[CLS]", "hello", "world", "[SEP]"]
    assert tokenizer.decode(ids) == "hello world"


def test_unigram_adds_eos_like_llama_cpp(vocab_dir: Path) -> None:
    tokenizer = Tokenizer.from_gguf(open_gguf(vocab_dir / "ggml-vocab-nomic-bert-moe.gguf"))
    ids = tokenizer.encode("Hello")
    assert ids[-1] in tokenizer.eos_token_ids and ids[0] == tokenizer.bos_token_id


# The GGUF header check: vocabulary-only files open, truncated ones still do not.


def test_vocab_only_file_opens(vocab_dir: Path) -> None:
    reader = open_gguf(vocab_dir / "ggml-vocab-gpt-2.gguf")
    assert len(reader.tensors) == 0


def test_truncated_real_file_is_still_rejected(tmp_path: Path, smollm2_gguf: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with smollm2_gguf.open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(smollm2_gguf.stat().st_size - 4096))
    with pytest.raises(ModelLoadError, match="incomplete or damaged"):
        open_gguf(cut)


def test_truncated_vocab_only_file_is_rejected(tmp_path: Path, vocab_dir: Path) -> None:
    whole = vocab_dir / "ggml-vocab-gpt-2.gguf"
    cut = tmp_path / "cut.gguf"
    shutil.copyfile(whole, cut)
    with cut.open("r+b") as handle:
        handle.truncate(whole.stat().st_size - 100)
    with pytest.raises(ModelLoadError, match="incomplete or damaged"):
        open_gguf(cut)


# Pre-tokenizer names.


def test_every_pre_tokenizer_regex_compiles() -> None:
    from tokenizers import Regex, pre_tokenizers

    for name, spec in PRE_TOKENIZERS.items():
        for pattern in spec.splits:
            split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
            assert "".join(p for p, _ in split.pre_tokenize_str("It's 12345 Hello, 世界!\n")), name


def _pieces(name: str, text: str) -> list[str]:
    from tokenizers import Regex, pre_tokenizers

    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[name].splits]
    return [piece for piece, _ in pre_tokenizers.Sequence(splits).pre_tokenize_str(text)]


def test_splits_llama_cpp_does_in_cpp() -> None:
    """Patterns llama.cpp hard-codes in unicode.cpp, written here as regexes (no vectors upstream)."""
    assert _pieces("tiny_aya", "x1234567") == ["x", "1", "234", "567"]  # threes from the right
    assert _pieces("afmoe", "x 1234567 日本abc") == ["x", " ", "1", "234", "567", " ", "日本", "abc"]
    assert _pieces("kimi-k2", "Hello世界abc It's 12345") == [
        "Hello",
        "世界",
        "abc",
        " It's",
        " ",
        "123",
        "45",
    ]


def test_unknown_pre_tokenizer_is_a_typed_load_error(tmp_path: Path) -> None:
    cfg = tiny_config("llama", hidden_size=32, intermediate_size=64, head_dim=16, num_hidden_layers=1)
    embed = {"model.embed_tokens.weight": random_state_dict(cfg)["model.embed_tokens.weight"]}
    path = write_tiny_gguf(tmp_path / "x.gguf", embed, cfg, "F32", "gpt2", pre="no-such-split")
    with pytest.raises(UnsupportedTokenizerError, match=r"'no-such-split'.*safetensors"):
        Tokenizer.from_gguf(open_gguf(path))


def test_unigram_matches_sentencepiece_itself(vocab_dir: Path) -> None:
    """No llama.cpp vectors for the Unigram vocabulary: the sentencepiece library, given the same pieces,
    scores and normalization map, is the reference, on every test text llama.cpp has."""
    spm = pytest.importorskip("sentencepiece")
    from localchat.weights.gguf_tokenizer import GGUFVocab
    from tests.helpers.spm_proto import UNIGRAM, model_proto

    reader = open_gguf(vocab_dir / "ggml-vocab-nomic-bert-moe.gguf")
    vocab = GGUFVocab.read(reader)
    assert vocab.model == "t5" and vocab.scores is not None and vocab.unk_id is not None
    proto = model_proto(
        list(zip(vocab.tokens, vocab.scores, vocab.token_types, strict=True)),
        model_type=UNIGRAM,
        unk_id=vocab.unk_id,
        charsmap=vocab.charsmap,
        add_dummy_prefix=vocab.add_space_prefix is not False,
        remove_extra_whitespaces=vocab.remove_extra_whitespaces is not False,
    )
    reference = spm.SentencePieceProcessor(model_proto=proto)
    ours = Tokenizer.from_gguf(reader)
    texts = {text for name in WITH_VECTORS for text, _ in read_vectors(vocab_dir / f"ggml-vocab-{name}.gguf")}
    wrong = [t for t in sorted(texts) if ours.encode(t, add_special_tokens=False) != reference.encode(t)]
    assert len(texts) >= 50 and not wrong, wrong[:3]
