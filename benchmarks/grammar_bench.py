"""Grammar engines compared for constrained decoding: llguidance, xgrammar, outlines-core.

Per vocabulary (SmolLM2's 49k from its GGUF; a 152k Qwen2 vocabulary from a vocab-only GGUF such as
llama.cpp's models/ggml-vocab-qwen2.gguf): tokenizer setup time, JSON Schema compile time, and the
time to fill one token bitmask while walking a valid document token by token. Then which JSON Schema
features each engine *enforces* (compiles, accepts a valid document, rejects an invalid one).

python benchmarks/grammar_bench.py --model .models/SmolLM2-135M-Instruct.Q4_1.gguf \
    [--vocab-gguf path/to/ggml-vocab-qwen2.gguf] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localchat.weights.gguf_tokenizer import byte_level_alphabet
from localchat.weights.tokenizer import Tokenizer

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "color": {"enum": ["red", "green", "blue"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "color", "age", "tags", "address"],
    "additionalProperties": False,
}
PERSON_DOC = {
    "name": "Ada Lovelace",
    "color": "green",
    "age": 36,
    "tags": ["math", "engines"],
    "address": {"city": "London", "zip": "12345"},
}


def obj(prop: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"v": prop}, "required": ["v"], **extra}


# feature -> (schema, a valid document, an invalid one)
FEATURES: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "enum": (obj({"enum": ["a", "b"]}), {"v": "a"}, {"v": "c"}),
    "const": (obj({"const": "x"}), {"v": "x"}, {"v": "y"}),
    "anyOf": (obj({"anyOf": [{"type": "integer"}, {"type": "boolean"}]}), {"v": True}, {"v": "s"}),
    "$ref": (
        {"$defs": {"n": {"type": "integer"}}, **obj({"$ref": "#/$defs/n"})},
        {"v": 3},
        {"v": "3"},
    ),
    "pattern": (obj({"type": "string", "pattern": "^[a-c]+$"}), {"v": "abc"}, {"v": "abd"}),
    "minimum/maximum": (obj({"type": "integer", "minimum": 5, "maximum": 9}), {"v": 7}, {"v": 12}),
    "minLength/maxLength": (
        obj({"type": "string", "minLength": 2, "maxLength": 3}),
        {"v": "ab"},
        {"v": "abcd"},
    ),
    "minItems/maxItems": (
        obj({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}),
        {"v": [1, 2]},
        {"v": [1]},
    ),
    "additionalProperties: false": (
        obj({"type": "integer"}, additionalProperties=False),
        {"v": 1},
        {"v": 1, "w": 2},
    ),
    "format: date-time": (
        obj({"type": "string", "format": "date-time"}),
        {"v": "2024-01-02T03:04:05Z"},
        {"v": "yesterday"},
    ),
    "format: email": (obj({"type": "string", "format": "email"}), {"v": "a@b.org"}, {"v": "not an email"}),
    "format: uuid": (
        obj({"type": "string", "format": "uuid"}),
        {"v": "123e4567-e89b-12d3-a456-426614174000"},
        {"v": "123"},
    ),
}


def dump(doc: Any) -> str:
    return json.dumps(doc, ensure_ascii=False)  # ", " and ": ": the separators every engine is set to


class Matcher:
    def fill(self, bitmask: np.ndarray) -> None: ...
    def accept(self, token: int) -> bool: ...


class Engine:
    name = ""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None: ...
    def compile(self, schema: dict[str, Any]) -> Callable[[], Matcher]: ...


class LLGuidance(Engine):
    name = "llguidance"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        import llguidance

        self.lib = llguidance
        self.tok = llguidance.LLTokenizer(
            tokenizer.backend.to_str(), n_vocab=vocab_size, eos_token=tokenizer.eos_token_ids
        )

    def compile(self, schema: dict[str, Any]) -> Callable[[], Matcher]:
        import llguidance.numpy as lln

        from localchat.structured.grammar import JSON_OPTIONS

        grammar = self.lib.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
        fresh = self.lib.LLMatcher(self.tok, grammar, log_level=0)
        if fresh.is_error():
            raise ValueError(fresh.get_error())

        class M(Matcher):
            def __init__(self) -> None:
                self.m = fresh.deep_copy()

            def fill(self, bitmask: np.ndarray) -> None:
                lln.fill_next_token_bitmask(self.m, bitmask, 0)

            def accept(self, token: int) -> bool:
                return self.m.consume_token(token)

        return M


class XGrammar(Engine):
    name = "xgrammar"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        import xgrammar

        self.lib = xgrammar
        vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
        encoded = [""] * vocab_size
        for text, token_id in vocab.items():
            encoded[token_id] = text
        info = xgrammar.TokenizerInfo(
            encoded,
            xgrammar.VocabType.BYTE_LEVEL,
            vocab_size=vocab_size,
            stop_token_ids=tokenizer.eos_token_ids,
        )
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)

    def compile(self, schema: dict[str, Any]) -> Callable[[], Matcher]:
        compiled = self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(", ", ": "), strict_mode=True
        )
        lib = self.lib

        class M(Matcher):
            def __init__(self) -> None:
                self.m = lib.GrammarMatcher(compiled)

            def fill(self, bitmask: np.ndarray) -> None:
                self.m.fill_next_token_bitmask(bitmask, 0)

            def accept(self, token: int) -> bool:
                return self.m.accept_token(token)

        return M


class OutlinesCore(Engine):
    name = "outlines-core"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        import outlines_core

        self.lib = outlines_core
        decoder = {c: b for b, c in byte_level_alphabet().items()}
        eos = tokenizer.eos_token_ids[0]
        mapping: dict[bytes, list[int]] = {}
        for text, token_id in tokenizer.backend.get_vocab(with_added_tokens=True).items():
            if token_id == eos:
                continue
            raw = bytes(decoder[c] for c in text) if all(c in decoder for c in text) else text.encode()
            mapping.setdefault(raw, []).append(token_id)
        self.vocab = outlines_core.Vocabulary(eos, mapping)

    def compile(self, schema: dict[str, Any]) -> Callable[[], Matcher]:
        regex = self.lib.json_schema.build_regex_from_schema(json.dumps(schema), r"[ ]?")
        index = self.lib.Index(regex, self.vocab)
        lib = self.lib

        class M(Matcher):
            def __init__(self) -> None:
                self.g = lib.Guide(index)

            def fill(self, bitmask: np.ndarray) -> None:
                self.g.write_mask_into(bitmask.ctypes.data, bitmask.size, bitmask.itemsize)

            def accept(self, token: int) -> bool:
                try:
                    self.g.advance(token)
                except Exception:
                    return False
                return True

        return M


ENGINES: list[type[Engine]] = [LLGuidance, XGrammar, OutlinesCore]


def walk(factory: Callable[[], Matcher], tokens: list[int], words: int) -> tuple[bool, list[float]]:
    """Fill a mask and accept each token in turn: (all accepted, seconds per mask)."""
    matcher = factory()
    bitmask = np.full((1, words), -1, dtype=np.int32)
    times = []
    for token in tokens:
        start = time.perf_counter()
        matcher.fill(bitmask)
        times.append(time.perf_counter() - start)
        if not matcher.accept(token):
            return False, times
    return True, times


def measure(engine_cls: type[Engine], tokenizer: Tokenizer, vocab_size: int, rounds: int) -> dict[str, Any]:
    start = time.perf_counter()
    engine = engine_cls(tokenizer, vocab_size)
    setup = time.perf_counter() - start
    compiles, masks = [], []
    tokens = tokenizer.encode(dump(PERSON_DOC), add_special_tokens=False)
    words = -(-vocab_size // 32)
    ok = True
    for _ in range(rounds):
        start = time.perf_counter()
        factory = engine.compile(PERSON)
        compiles.append(time.perf_counter() - start)
        accepted, times = walk(factory, tokens, words)
        ok = ok and accepted
        masks.extend(times)
    features = {}
    for feature, (schema, good, bad) in FEATURES.items():
        try:
            factory = engine.compile(schema)
        except Exception:
            features[feature] = "no (refused)"
            continue
        good_ok, _ = walk(factory, tokenizer.encode(dump(good), add_special_tokens=False), words)
        bad_ok, _ = walk(factory, tokenizer.encode(dump(bad), add_special_tokens=False), words)
        features[feature] = (
            "yes" if good_ok and not bad_ok else ("IGNORED" if bad_ok else "no (rejects valid)")
        )
    return {
        "setup_s": setup,
        "compile_ms": statistics.median(compiles) * 1000,
        "mask_us_median": statistics.median(masks) * 1e6,
        "mask_us_mean": statistics.fmean(masks) * 1e6,
        "mask_us_p95": float(np.percentile(masks, 95)) * 1e6,
        "walk_ok": ok,
        "num_tokens": len(tokens),
        "features": features,
    }


def load_tokenizer(path: Path) -> tuple[Tokenizer, int]:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    tokenizer = Tokenizer.from_gguf(reader)
    return tokenizer, tokenizer.vocab_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a GGUF whose tokenizer is the 49k vocabulary")
    ap.add_argument("--vocab-gguf", type=Path, help="a second (e.g. 152k Qwen2) vocabulary, vocab-only GGUF")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    vocabularies = [args.model] + ([args.vocab_gguf] if args.vocab_gguf else [])
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for path in vocabularies:
        tokenizer, vocab_size = load_tokenizer(path)
        for engine_cls in ENGINES:
            try:
                results[(engine_cls.name, vocab_size)] = measure(
                    engine_cls, tokenizer, vocab_size, args.rounds
                )
            except Exception as exc:  # an engine that cannot run here is reported, not fatal
                results[(engine_cls.name, vocab_size)] = {"error": f"{type(exc).__name__}: {exc}"}
    print(
        "| engine | vocab | tokenizer setup s | schema compile ms | mask us (median) | mask us (mean) | mask us (p95) | walk ok |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (name, vocab), r in results.items():
        if "error" in r:
            print(f"| {name} | {vocab} | error: {r['error'][:80]} | | | | | |")
            continue
        print(
            f"| {name} | {vocab} | {r['setup_s']:.2f} | {r['compile_ms']:.1f} | {r['mask_us_median']:.0f} "
            f"| {r['mask_us_mean']:.0f} | {r['mask_us_p95']:.0f} | {r['walk_ok']} ({r['num_tokens']} tokens) |"
        )
    first_vocab = next(iter(results))[1]
    names = [e.name for e in ENGINES]
    print()
    print("| JSON Schema feature (enforced?) | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for feature in FEATURES:
        cells = [results.get((n, first_vocab), {}).get("features", {}).get(feature, "-") for n in names]
        print(f"| {feature} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
