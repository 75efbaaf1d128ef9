"""`--speculative mtp` from a GGUF: llama.cpp's own converter (without --no-mtp) writes the MTP head of a
tiny random Qwen3.5 / Qwen3-Next folder as an extra `nextn` block; loaded from the f32 file the head's
drafts equal the plain-torch reference's (test_speculative_mtp.py), and from the Q8_0 file (its blocks kept
as the file stores them) output still equals plain decoding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from localchat import LLM, SamplingParams
from localchat.weights.loader import load_model
from tests.backends.test_hybrid_gguf import _convert, _save_with_tokenizer, tiny_qwen3_5, tiny_qwen3_next
from tests.backends.test_speculative_mtp import Reference, mtp_tensors
from tests.helpers.mtp import recorded

pytestmark = pytest.mark.slow  # runs llama.cpp's converter twice per family

FAMILIES = {"qwen35": tiny_qwen3_5, "qwen3next": tiny_qwen3_next}


def mtp_ggufs(hf: Any, tmp_path: Path) -> tuple[dict[str, torch.Tensor], Path, Path]:
    """`hf`'s folder with a random MTP head (seed 7) and `mtp_num_hidden_layers: 1` in its config, as
    llama.cpp's converter writes it to f32 and Q8_0 GGUFs: (the head's tensors, f32 file, Q8_0 file)."""
    mtp = mtp_tensors(hf, seed=7)
    folder = _save_with_tokenizer(hf, tmp_path / "hf")
    file = folder / "model.safetensors"
    save_file({**load_file(str(file)), **mtp}, str(file))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 1}))
    f32 = _convert(folder, tmp_path / "f32.gguf", "f32")
    q8 = _convert(folder, tmp_path / "q8_0.gguf", "q8_0")
    return mtp, f32, q8


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gguf_nextn_block_drafts_like_the_reference(tmp_path: Path, family: str) -> None:
    hf: Any = FAMILIES[family]()
    mtp, f32, q8 = mtp_ggufs(hf, tmp_path)
    bundle = load_model(f32)
    assert bundle.config.extra.get("gguf_mtp_layers") == 1
    assert bundle.config.num_hidden_layers == hf.config.num_hidden_layers

    prompt = [int(t) for t in torch.randint(3, 290, (21,), generator=torch.Generator().manual_seed(1))]
    params = SamplingParams(max_tokens=14, temperature=0.0)
    reference = Reference(hf, mtp)
    for path in (f32, q8):
        plain = LLM(path, backend="torch", dtype="float32", speculative="off").generate([prompt], params)
        llm = LLM(path, backend="torch", dtype="float32", speculative="auto")  # auto: the file has a head
        assert llm.engine.config.speculative.method == "mtp"
        seen = recorded(llm.engine.scheduler.proposer)
        assert llm.generate([prompt], params)[0].token_ids == plain[0].token_ids
        assert seen
        if path == f32:
            for tokens, computed, k, drafts in seen:
                assert drafts == reference.drafts(tokens, computed, k)[0]
