"""XLM-R GGUFs (bge-m3, multilingual-e5): llama.cpp's converter writes them as arch `bert` with a `t5`
(Unigram) vocabulary and position embeddings trimmed of XLM-R's pad_token_id + 1 offset. A tiny random
XLMRobertaModel with a hand-written SentencePiece model goes through the real converter; localchat's
encoder and the GGUF's own Unigram tokenizer must give transformers' vectors and XLM-R's ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.llama_convert import convert
from tests.helpers.spm_proto import UNIGRAM, model_proto

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
pytest.importorskip("google.protobuf", reason="llama.cpp's XLM-R vocabulary reader needs protobuf")
pytestmark = pytest.mark.slow  # runs llama.cpp's converter

TEXTS = ["the cat sleeps", "a dog eats food", "cats and dogs"]
_WORDS = ["the", "cat", "cats", "sleep", "s", "a", "dog", "dogs", "eat", "food", "and", "o", "t", "e"]


def _spm_model() -> bytes:
    # sentencepiece.bpe.model's layout: <unk> <s> </s> then pieces (the HF tokenizer shifts them by one)
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("\u2581", -3.0, 1)]
    pieces += [(f"\u2581{w}", -1.0 - i * 0.1, 1) for i, w in enumerate(_WORDS)]
    pieces += [(c, -8.0, 1) for c in "abcdefghijklmnopqrstuvwxyz"]
    return model_proto(
        pieces,
        model_type=UNIGRAM,
        unk_id=0,
        charsmap=None,
        add_dummy_prefix=True,
        remove_extra_whitespaces=True,
    )


def _xlmr_ids(sp: object, text: str) -> list[int]:
    # XLMRobertaTokenizer: fairseq ids (<s>=0, <pad>=1, </s>=2, <unk>=3), sentencepiece id + 1 otherwise
    return [0, *(i + 1 for i in sp.encode(text)), 2]  # type: ignore[attr-defined]


@pytest.fixture
def xlmr_gguf(tmp_path: Path) -> tuple[Path, torch.nn.Module, object]:
    proto = _spm_model()
    sp = spm.SentencePieceProcessor(model_proto=proto)
    torch.manual_seed(31)
    config = transformers.XLMRobertaConfig(
        vocab_size=sp.vocab_size() + 1, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=66, pad_token_id=1, type_vocab_size=1,
    )  # fmt: skip
    model = transformers.XLMRobertaModel(config, add_pooling_layer=False).eval()
    folder = tmp_path / "xlmr"
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "sentencepiece.bpe.model").write_bytes(proto)
    # sentence-transformers' CLS pooling, as bge-m3 ships it: the converter writes it as pooling_type
    modules = [
        {"idx": "0", "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": "1", "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    return convert(folder, tmp_path / "xlmr.gguf", "f32"), model, sp


def test_xlmr_gguf_matches_transformers(xlmr_gguf: tuple[Path, torch.nn.Module, object]) -> None:
    from localchat.backends.torch.encoders.gguf_encoder import load_gguf_encoder
    from localchat.embeddings.gguf_text import gguf_encoder_tokenizer

    gguf_path, model, sp = xlmr_gguf
    tokenizer = gguf_encoder_tokenizer(gguf_path, 64)
    items = [tokenizer.encode(t) for t in TEXTS]
    assert [item.ids for item in items] == [_xlmr_ids(sp, t) for t in TEXTS]
    pair = tokenizer.encode("the cat", "a dog")
    assert pair.ids == [*_xlmr_ids(sp, "the cat"), 2, *_xlmr_ids(sp, "a dog")[1:]]  # <s> a </s></s> b </s>
    assert set(pair.type_ids) == {0}  # XLM-R has one token type
    encoder, sentence = load_gguf_encoder(gguf_path)
    assert sentence.pooling == "cls" and sentence.normalize
    rows = []
    for item in items:  # one at a time: no padding in the reference
        with torch.no_grad():
            h = model(input_ids=torch.tensor([item.ids])).last_hidden_state[0]
        rows.append(torch.nn.functional.normalize(h[0], dim=-1))
    np.testing.assert_allclose(encoder.embed(items), torch.stack(rows).numpy(), atol=2e-5)
