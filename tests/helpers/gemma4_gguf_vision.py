"""A tiny Gemma 4 vision checkpoint as llama.cpp publishes it: the separate `mmproj-*.gguf` projector by
llama.cpp's own converter (`--mmproj`: vision tower + embedder, `clip.vision.projector_type` gemma4v) and,
beside it, a Gemma 4 text GGUF's header (architecture, width, vocabulary: all that pairing reads; the text
weights are not needed to check the pair)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.gemma4_vision_models import tokenizer, write_folder
from tests.helpers.llama_convert import ensure_converter


def write_gguf_pair(source: Path, out: Path) -> tuple[Any, Path, Path]:
    """(transformers' model, text GGUF, mmproj GGUF): the checkpoint saved in `source`, the GGUFs in `out`."""
    hf = write_folder(source)
    mmproj = out / "mmproj-tiny-gemma4-f32.gguf"
    script = ensure_converter() / "convert_hf_to_gguf.py"
    cmd = [sys.executable, str(script), str(source), "--outfile", str(mmproj), "--outtype", "f32", "--mmproj"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return hf, _text_gguf(out / "tiny-gemma4-f32.gguf"), mmproj


def _text_gguf(path: Path) -> Path:
    import gguf

    vocab = tokenizer().get_vocab()
    writer = gguf.GGUFWriter(str(path), "gemma4")
    writer.add_embedding_length(64)
    writer.add_token_list([token for token, _ in sorted(vocab.items(), key=lambda item: item[1])])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
