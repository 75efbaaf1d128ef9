"""Our GGUF-built tokenizers against transformers' conversion of the same file (and real SentencePiece).

Where transformers' conversion is known to differ from the model's real tokenizer, the test pins the
correct behaviour instead, and says why:
- "smollm" pre-tokenizer: the real SmolLM2 tokenizer (and llama.cpp) split every digit off before
  GPT-2's regex; transformers skips that step, so "a  1" becomes "a", "Ġ", "Ġ1"-pieces instead of "a",
  "ĠĠ", "1". We compare against transformers with the real pre-tokenizer put back.
- SentencePiece text that starts with a space: SentencePiece adds its dummy prefix anyway (" a" ->
  "▁▁a"); transformers' Metaspace skips it ("▁a") and then loses a space on decode. We compare those
  strings against the sentencepiece library itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from localchat.weights.gguf import open_gguf
from localchat.weights.gguf_tokenizer import byte_level_alphabet
from localchat.weights.tokenizer import Tokenizer
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, tiny_spm, write_tiny_gguf

transformers = pytest.importorskip("transformers")

CORPUS = [
    "Hello world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n\n\tif x:\n\t\tpass\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * 2; }",
    "a  1  22   333 4444 and 3.14159, 1,000,000 or 12345678",
    "   leading and trailing   ",
    "\n\n\nnewlines\r\n\r\nand  \t tabs\t\t",
    "日本語のテキストです。東京は大きい。中文文本",
    "مرحبا بالعالم، كيف حالك؟",
    "Emoji 😀🎉👍 🤖 and ZWJ 👩‍💻",
    "It's we'll DON'T I'M they've",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more <|im_start|> spaced",
    "Café déjà vu, naïve Über façade",
    "x" * 40,
    "",
    " ",
    "\n",
]


def _parity(ours: Tokenizer, ref, texts: list[str]) -> None:
    for text in texts:
        ids = ours.encode(text)
        assert ids == ref.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), text
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids), text


def _reference(path: Path):
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _with_real_smollm_split(ref):
    """transformers' tokenizer with SmolLM2's real pre-tokenizer: digits apart, then GPT-2's byte-level split."""
    from tokenizers import pre_tokenizers

    ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    return ref


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tok")


def _tiny(tiny_dir: Path, kind: str, pre: str = "smollm", **kwargs) -> Path:
    cfg = tiny_config("llama", hidden_size=32, intermediate_size=64, head_dim=16, num_hidden_layers=1)
    embed = {"model.embed_tokens.weight": random_state_dict(cfg)["model.embed_tokens.weight"]}
    return write_tiny_gguf(tiny_dir / f"{kind}-{pre}.gguf", embed, cfg, "F32", kind, pre=pre, **kwargs)


# The real model.


@pytest.fixture(scope="module")
def smollm2_tokenizers(smollm2_gguf: Path):
    return Tokenizer.from_gguf(open_gguf(smollm2_gguf)), _reference(smollm2_gguf)


def test_smollm2_matches_its_real_tokenizer(smollm2_tokenizers) -> None:
    ours, ref = smollm2_tokenizers
    _parity(ours, _with_real_smollm_split(_reference_copy(ref)), CORPUS)


def _reference_copy(ref):
    import copy

    return copy.deepcopy(ref)


def test_smollm2_differs_from_transformers_only_where_transformers_is_wrong(smollm2_tokenizers) -> None:
    ours, ref = smollm2_tokenizers
    diverging = [t for t in CORPUS if ours.encode(t) != ref.encode(t)]
    assert diverging == ["a  1  22   333 4444 and 3.14159, 1,000,000 or 12345678"]
    # llama.cpp's "smollm" split: "a", "  " (one token), "1"; transformers gives "a", " ", " 1" -> Ġ, Ġ, 1.
    assert [ours.id_to_token(i) for i in ours.encode("a  1")] == ["a", "ĠĠ", "1"]
    assert [ref.convert_ids_to_tokens(i) for i in ref.encode("a  1")] == ["a", "Ġ", "Ġ", "1"]


def test_smollm2_special_token_facts(smollm2_tokenizers) -> None:
    ours, ref = smollm2_tokenizers
    assert (ours.bos_token, ours.bos_token_id) == ("<|im_start|>", 1)
    assert (ours.eos_token, ours.eos_token_ids) == ("<|im_end|>", [2])
    assert not ours.add_bos and ours.vocab_size == 49152 == len(ref)
    assert ours.all_special_ids == set(range(17))  # the 17 control tokens, <|endoftext|> .. <empty_output>
    assert ours.token_to_id("<|im_end|>") == 2 and ours.id_to_token(2) == "<|im_end|>"
    assert ours.decode(ours.encode("<|im_start|>hi<|im_end|>")) == "hi"


# Tiny byte-level BPE vocabularies, one per pre-tokenizer family.


@pytest.mark.parametrize(("pre", "add_bos"), [("gpt-2", None), ("llama-bpe", True), ("qwen2", False)])
def test_tiny_byte_level_matches_transformers(tiny_dir: Path, pre: str, add_bos: bool | None) -> None:
    path = _tiny(tiny_dir, "gpt2", pre, add_bos=add_bos)
    ours = Tokenizer.from_gguf(open_gguf(path))
    assert ours.add_bos is bool(add_bos)
    _parity(ours, _reference(path), [*CORPUS, "text<think>inner</think>after"])


def test_tiny_smollm_matches_the_real_split(tiny_dir: Path) -> None:
    path = _tiny(tiny_dir, "gpt2", "smollm")
    _parity(Tokenizer.from_gguf(open_gguf(path)), _with_real_smollm_split(_reference(path)), CORPUS)


def test_user_defined_tokens_stay_whole_and_are_not_special(tiny_dir: Path) -> None:
    ours = Tokenizer.from_gguf(open_gguf(_tiny(tiny_dir, "gpt2", "qwen2")))
    ids = ours.encode("a<think>b</think>")
    assert ours.token_to_id("<think>") in ids and ours.token_to_id("</think>") in ids
    assert ours.decode(ids) == "a<think>b</think>"  # kept by skip_special_tokens
    assert ours.token_to_id("<think>") not in ours.all_special_ids


def test_llama3_family_adds_bos_when_the_file_does_not_say(tiny_dir: Path) -> None:
    # llama.cpp's rule for Llama 3 vocabularies without add_bos_token (transformers would add none).
    ours = Tokenizer.from_gguf(open_gguf(_tiny(tiny_dir, "gpt2", "llama-bpe")))
    assert ours.add_bos and ours.encode("hi")[0] == ours.bos_token_id
    assert ours.encode("hi", add_special_tokens=False)[0] != ours.bos_token_id


def test_qwen2_normalizes_to_nfc(tiny_dir: Path) -> None:
    ours = Tokenizer.from_gguf(open_gguf(_tiny(tiny_dir, "gpt2", "qwen2")))
    # Qwen2's tokenizer.json normalizes to NFC, so a decomposed accent tokenizes like the composed one.
    assert ours.encode("cafe\u0301") == ours.encode("caf\u00e9")


# Tiny SentencePiece vocabulary.


def test_tiny_sentencepiece_matches_transformers(tiny_dir: Path) -> None:
    path = _tiny(tiny_dir, "llama")
    ours = Tokenizer.from_gguf(open_gguf(path))
    assert ours.add_bos and ours.bos_token == "<s>" and ours.eos_token == "</s>"
    _parity(ours, _reference(path), [t for t in CORPUS if t and not t[0].isspace()])


def test_tiny_sentencepiece_matches_sentencepiece_itself(tiny_dir: Path) -> None:
    ours = Tokenizer.from_gguf(open_gguf(_tiny(tiny_dir, "llama")))
    sp = tiny_spm()
    for text in [t for t in CORPUS if "<|" not in t] + [" a", "  two"]:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == sp.encode(text), text
        assert ours.decode(ids) == sp.decode(ids), text


def test_sentencepiece_without_space_prefix(tiny_dir: Path) -> None:
    ours = Tokenizer.from_gguf(open_gguf(_tiny(tiny_dir, "llama", add_space_prefix=False)))
    ids = ours.encode("hello", add_special_tokens=False)
    assert not ours.id_to_token(ids[0]).startswith("▁")
    assert ours.decode(ids) == "hello"


# Hugging Face folders.


def test_from_hf_folder_matches_auto_tokenizer(tmp_path: Path, smollm2_tokenizers) -> None:
    _, ref = smollm2_tokenizers
    ref.save_pretrained(tmp_path)
    ours = Tokenizer.from_hf_folder(tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (ours.bos_token, ours.eos_token) == (auto.bos_token, auto.eos_token)
    _parity(ours, auto, CORPUS)


def test_from_hf_folder_sentencepiece_with_bos(tmp_path: Path, tiny_dir: Path) -> None:
    _reference(_tiny(tiny_dir, "llama")).save_pretrained(tmp_path)
    ours = Tokenizer.from_hf_folder(tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert ours.add_bos and ours.encode("hi")[0] == auto.bos_token_id
    _parity(ours, auto, CORPUS)


def test_from_hf_folder_bos_from_the_post_processor(tmp_path: Path, tiny_dir: Path) -> None:
    """Llama 3-style folders: tokenizer.json's TemplateProcessing adds BOS, the config has no flag."""
    import json

    from tokenizers import processors

    ref = _reference(_tiny(tiny_dir, "gpt2", "llama-bpe"))
    backend = ref.backend_tokenizer
    backend.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", ref.convert_tokens_to_ids("<|im_start|>"))]
    )
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = Tokenizer.from_hf_folder(tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert ours.add_bos and auto.encode("hi")[0] == ours.bos_token_id
    _parity(ours, auto, CORPUS)


def test_deepseek_llm_pre_tokenizer_splits_like_deepseek_v2(tiny_dir: Path) -> None:
    """DeepSeek LLM / V2(-Lite) GGUF files say `deepseek-llm` (llama.cpp's split list for them): letter
    runs keep one leading space, digit runs stay whole (SmolLM's split is one digit a piece, GPT-2's
    joins " 2024"), CJK runs and punctuation runs are pieces of their own."""
    ours = Tokenizer.from_gguf(open_gguf(_tiny(tiny_dir, "gpt2", "deepseek-llm")))
    pre = ours.backend.pre_tokenizer
    assert pre is not None

    def pieces(text: str) -> list[str]:
        decode = {ch: b for b, ch in byte_level_alphabet().items()}
        return [bytes(decode[c] for c in piece).decode("utf-8") for piece, _ in pre.pre_tokenize_str(text)]

    assert pieces("Hello world 2024!") == ["Hello", " world", " ", "2024", "!"]
    assert pieces("\u4e2d\u6587 and \u03c9\u03bc\u03ad\u03b3\u03b1.") == [
        "\u4e2d\u6587",
        " and",
        " \u03c9\u03bc\u03ad\u03b3\u03b1",
        ".",
    ]
    # The splits refine each other in order, as in the reference: the punctuation class spans ":"-"~"
    # (ASCII letters too), so a word mixing ASCII and other letters comes apart.
    assert pieces(" \u00f1and\u00fa") == [" \u00f1", "and", "\u00fa"]
    assert pieces("a\nb") == ["a", "\n", "b"]
    # Its "CJK" class spans U+0800-U+4E00, Greek Extended included, so those runs lose their space.
    assert pieces("\u1f5f\u1f7d \u1fd0\u1fd3") == ["\u1f5f\u1f7d", " ", "\u1fd0\u1fd3"]
    assert ours.decode(ours.encode("Hello world 2024!")) == "Hello world 2024!"
