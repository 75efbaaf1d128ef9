"""llama.cpp's BPE pre-tokenizers (`tokenizer.ggml.pre`): name -> the regexes that split text into words.

The list and the regexes are llama.cpp's (src/llama-vocab.cpp). Where llama.cpp rewrote a model's
tokenizer.json regex for its own regex engine (case-insensitive groups spelt out, possessive quantifiers
dropped, the digit-grouping and Kimi K2 patterns done in C++), the table keeps a pattern with the same
matches that Oniguruma (the `tokenizers` regex engine) runs directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from localchat.errors import ModelLoadError


class UnsupportedTokenizerError(ModelLoadError):
    code = "unsupported_tokenizer"


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    splits: tuple[str, ...]  # applied in order; every piece, matched or not, stays a piece
    ignore_merges: bool = False  # a word that is a whole token is taken as is (Llama 3, Tekken)
    nfc: bool = False  # Qwen2's tokenizer.json normalizes to NFC first
    add_bos: bool = False  # llama.cpp's default when the file has no add_bos_token
    # False: raw UTF-8 tokens with <0xXX> byte fallback instead of GPT-2's byte alphabet (Gemma 4, Jina zh).
    byte_level: bool = True
    escape_spaces: bool = False  # spaces spelt "▁" before splitting (SentencePiece-shaped BPE)


_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_JAIS2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
    r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's own form (letters or marks that are not ASCII lower / upper case), kept as it is.
_GRANITE_EMB_MULTI = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+"
    + _CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*"
    + _CONTRACTIONS
    + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_YOUTU = (
    "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_NOT_HAN_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_NOT_HAN_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_KIMI_K2 = (
    rf"\p{{Han}}+|[^\r\n\p{{L}}\p{{N}}]?{_NOT_HAN_UPPER}*{_NOT_HAN_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_NOT_HAN_UPPER}+{_NOT_HAN_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_BAILINGMOE = (
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
)
_SEED_CODER = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_EXAONE_MOE = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?"
    r"|\s*[\r\n]|\s+(?!\S)|\s+"
)
_MINICPM5 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# DeepSeek V3 and its relatives: a punctuation mark may lead an ASCII word; CJK/kana runs apart.
_DEEPSEEK_V3_WORDS = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPARK2_5_WORDS = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"
)
_CJK_KANA = "[一-龥぀-ゟ゠-ヿ]+"
# Digit runs in groups of three counted from the right ("1234567" -> "1", "234", "567").
_DIGITS_BY_THREE = r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"
_AFMOE_ASIAN = "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+"
_NO_BREAK_RUN = r" ?[^(\s|.,!?…。，、।۔،)]+"
_CHAMELEON = (
    r"<sentinel:[0-9]+>",
    r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    r"([\t\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    GPT2,
)
_NEWLINE_RUNS = r"[^\n]+|[\n]+"
# DeepSeek LLM / DeepSeek-V2(-Lite): runs of cased letters (Latin, Greek, Cyrillic, ... written as code
# point ranges) with an optional leading space, ASCII and full-width punctuation runs, CJK runs and
# digit runs. Escaped: some of these letters would change under an editor's NFC normalization.
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386"
    "\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a"
    "\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4"
    "\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d"
    "\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_DEEPSEEK_LLM = (
    r"[\r\n]",
    r"\s?[" + _DEEPSEEK_LLM_LETTERS + "]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}+",
)
_CJK_HANGUL = "[一-龥ࠀ-一가-퟿]+"

_PLAIN_GPT2 = PreTokenizer((GPT2,))
_STARCODER = PreTokenizer((r"\p{N}", GPT2))  # each digit on its own, then GPT-2's split
_LLAMA3 = PreTokenizer((LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_PLAIN = PreTokenizer((QWEN2,))
_DEEPSEEK_V3 = PreTokenizer((r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK_V3_WORDS))
_GPT4O_PRE = PreTokenizer((_GPT4O,))
_LLAMA3_SPLIT = PreTokenizer((LLAMA3,))
_SPM_SHAPED = PreTokenizer((_NEWLINE_RUNS,), byte_level=False, escape_spaces=True)
_BAILING = PreTokenizer((_BAILINGMOE,))
_TINY_AYA = PreTokenizer((_DIGITS_BY_THREE, _GPT4O))

# Every `tokenizer.ggml.pre` value llama.cpp accepts for a BPE vocabulary, grouped as llama.cpp groups them.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ),
        _LLAMA3,
    ),
    "minicpm5": PreTokenizer((r"\p{N}{1,3}", _MINICPM5), ignore_merges=True),
    "deepseek-llm": PreTokenizer(_DEEPSEEK_LLM),
    "deepseek-coder": PreTokenizer((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}")),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), _DEEPSEEK_V3),
    "spark2_5": PreTokenizer((r"\p{N}{1,3}", _CJK_KANA, _SPARK2_5_WORDS, r"\p{N}")),
    "youtu": PreTokenizer(_YOUTU, ignore_merges=True),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]")),
    **dict.fromkeys(
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
        _STARCODER,
    ),
    **dict.fromkeys(
        (
            "gpt-2",
            "gpt2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "exaone4",
            "trillion",
            "granite-docling",
        ),
        _PLAIN_GPT2,
    ),
    "jais-2": PreTokenizer((_JAIS2,)),
    **dict.fromkeys(("gemma4", "granite-embed-multi-311m", "sarvam-moe"), _SPM_SHAPED),
    "whitespace": PreTokenizer((r"\S+",), byte_level=False),
    "qwen2": PreTokenizer((QWEN2,), nfc=True),
    **dict.fromkeys(
        ("deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez", "hunyuan", "solar-open", "grok-2"),
        _QWEN2_PLAIN,
    ),
    "qwen35": PreTokenizer((_QWEN35,)),
    **dict.fromkeys(("dbrx", "smaug-bpe", "chatglm-bpe"), _LLAMA3_SPLIT),
    **dict.fromkeys(("glm4", "glm5"), PreTokenizer((LLAMA3,), ignore_merges=True)),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), PreTokenizer((_NO_BREAK_RUN,))),
    "viking": PreTokenizer((_NO_BREAK_RUN, r"\p{N}")),
    "tekken": PreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True),
    "chameleon": PreTokenizer(_CHAMELEON, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_PRE),
    "granite-embed-multi-97m": PreTokenizer((_GRANITE_EMB_MULTI,), ignore_merges=True),
    **dict.fromkeys(("tiny_aya", "cohere2moe"), _TINY_AYA),
    "superbpe": PreTokenizer((r"\p{N}+", r"\d{1,3}(?=(?:\d{3})*(?!\d))")),
    "kimi-k2": PreTokenizer((_KIMI_K2,)),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), _BAILING),
    "seed-coder": PreTokenizer((_SEED_CODER,)),
    "ufakzeka": PreTokenizer((_UFAKZEKA,)),
    "afmoe": PreTokenizer((_DIGITS_BY_THREE, _AFMOE_ASIAN, _DEEPSEEK_V3_WORDS)),
    "laguna": PreTokenizer((_NEWLINE_RUNS, QWEN2)),
    "exaone-moe": PreTokenizer((_EXAONE_MOE,)),
}


def pre_tokenizer_for(name: str | None) -> PreTokenizer:
    """The split for a vocabulary's `tokenizer.ggml.pre`; a file without one gets llama.cpp's default."""
    spec = PRE_TOKENIZERS.get(name or "default")
    if spec is None:
        raise UnsupportedTokenizerError(
            f"The GGUF tokenizer's pre-tokenizer {name!r} (tokenizer.ggml.pre) is not one localchat knows, "
            "so it cannot split text the way the model was trained. Use a GGUF converted by a llama.cpp "
            "release that knows this model, or the model's safetensors folder (its tokenizer.json). Known: "
            f"{', '.join(sorted(PRE_TOKENIZERS))}."
        )
    return spec
