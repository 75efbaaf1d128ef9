"""Which files of a repo make up the model asked for: the quant picker, split parts, safetensors sets.

Works on plain (path, size) pairs, so the same rules pick from the hub's file list and from a local
snapshot. GGUF repos hold one file per quant (`*-Q4_K_M.gguf`), sometimes split
(`*-00001-of-00003.gguf`), sometimes vision projectors (`mmproj-*.gguf`: never the model, but pulled with it, f16 first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from localchat.errors import ModelNotFoundError, UnknownQuantError

DEFAULT_QUANT = "Q4_K_M"  # what llama.cpp's `-hf ORG/REPO` picks too
# When a repo has no Q4_K_M: the nearest in size and quality first.
FALLBACK_QUANTS = ("Q4_K_M", "Q4_K_S", "Q4_0", "Q4_1", "Q5_K_M", "Q5_0", "Q8_0", "F16", "BF16")
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|MXFP4|NVFP4|F16|F32|BF16))(?=[-._/]|$)",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
SAFETENSORS_EXTRAS = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "model.safetensors.index.json",
    # sentence-transformers (embedding and rerank models): pooling, prompts, WordPiece/SentencePiece vocab
    "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "vocab.txt",
    "sentencepiece.bpe.model",
})  # fmt: skip
# The module folders sentence-transformers reads (1_Pooling, 2_Dense, 2_Normalize), not onnx/ or openvino/.
_ST_MODULE_FILE = re.compile(r"\d+_(Pooling|Dense|Normalize)/(config\.json|model\.safetensors)")


@dataclass(frozen=True, slots=True)
class Selection:
    """The files of one model inside a repo."""

    format: str  # "gguf" | "safetensors"
    quant: str | None
    paths: tuple[str, ...]  # repo-relative; for split GGUFs the parts in order
    size: int

    @property
    def main_path(self) -> str:
        """What the loader opens: the first GGUF part, or (for safetensors) the config."""
        return self.paths[0]


def quant_of(path: str) -> str | None:
    """`Qwen2.5-7B-Instruct-Q4_K_M-00001-of-00002.gguf` -> "Q4_K_M"."""
    matches = _QUANT.findall(_SPLIT.sub(".gguf", path))
    return matches[-1].upper() if matches else None


def split_total(path: str) -> int:
    """How many parts the GGUF `path` belongs to (1 when not split)."""
    m = _SPLIT.search(path)
    return int(m.group(2)) if m else 1


def is_chat_gguf(path: str) -> bool:
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith(".gguf") and "mmproj" not in name


def repo_format(paths: list[str]) -> str | None:
    if any(is_chat_gguf(p) for p in paths):
        return "gguf"
    if "config.json" in paths and any(p.endswith(".safetensors") for p in paths):
        return "safetensors"
    return None


def gguf_groups(files: dict[str, int]) -> dict[str, list[str]]:
    """Chat GGUFs grouped by model: key = path without the split suffix, value = parts in order."""
    groups: dict[str, list[str]] = {}
    for path in sorted(p for p in files if is_chat_gguf(p)):
        groups.setdefault(_SPLIT.sub(".gguf", path), []).append(path)
    return groups


def available_quants(files: dict[str, int]) -> list[tuple[str, int]]:
    """(quant or file name, total size) of every chat GGUF model in `files`, smallest first."""
    listing = [
        (quant_of(key) or key.rsplit("/", 1)[-1], sum(files[p] for p in parts))
        for key, parts in gguf_groups(files).items()
    ]
    return sorted(listing, key=lambda item: item[1])


def pick(
    repo_id: str, files: dict[str, int], *, quant: str | None = None, file: str | None = None
) -> Selection:
    """The model inside a repo's `files` ({path: size}) that `quant` or `file` names.

    No quant and no file: Q4_K_M for a GGUF repo (else the closest fallback), or the config, tokenizer
    and weights of a safetensors repo.
    """
    kind = repo_format(list(files))
    if file is not None:
        return _pick_file(repo_id, files, file)
    if kind == "gguf":
        return _pick_quant(repo_id, files, quant)
    if kind == "safetensors" and quant is None:
        # top-level files first: the model's folder is that of paths[0] (not 1_Pooling/)
        paths = tuple(sorted(_safetensors_files(files), key=lambda p: ("/" in p, p)))
        return Selection("safetensors", None, paths, sum(files[p] for p in paths))
    if kind == "safetensors":
        raise ModelNotFoundError(
            f"{repo_id} is a safetensors repo, it has no quants; pull it as `{repo_id}`.", param="model"
        )
    raise ModelNotFoundError(
        f"{repo_id} holds neither GGUF files nor a safetensors model (config.json + *.safetensors).",
        param="model",
    )


def _safetensors_files(files: dict[str, int]) -> list[str]:
    """Config, tokenizer and the transformers weights; not other copies (Mistral's consolidated.safetensors)."""
    top = [p for p in files if "/" not in p]
    weights = [p for p in top if p.endswith(".safetensors")]
    if any(p.startswith("model") for p in weights):
        weights = [p for p in weights if p.startswith("model")]
    modules = [p for p in files if _ST_MODULE_FILE.fullmatch(p)]
    return [p for p in top if p in SAFETENSORS_EXTRAS] + weights + modules


def _pick_quant(repo_id: str, files: dict[str, int], quant: str | None) -> Selection:
    groups = gguf_groups(files)
    by_quant: dict[str, list[str]] = {}
    for key, parts in groups.items():
        by_quant.setdefault(quant_of(key) or key, parts)  # first (shortest-sorted) wins
    if quant is None:
        wanted = next((q for q in FALLBACK_QUANTS if q in by_quant), None)
        if wanted is None and len(groups) == 1:
            wanted = next(iter(by_quant))
    else:
        wanted = quant.upper() if quant.upper() in by_quant else None
    if wanted is None:
        raise UnknownQuantError(repo_id, quant or DEFAULT_QUANT, available_quants(files))
    return gguf_selection(files, by_quant[wanted])


def _pick_file(repo_id: str, files: dict[str, int], file: str) -> Selection:
    lowered = {p.lower(): p for p in files}
    by_name = {p.rsplit("/", 1)[-1].lower(): p for p in files}
    path = lowered.get(file.lower()) or by_name.get(file.lower())
    if path is None:
        if not file.lower().endswith((".gguf", ".safetensors")):
            return _pick_quant(repo_id, files, file)  # ORG/REPO:QUANT spelled like a file-less tag
        raise ModelNotFoundError(
            f"{repo_id} has no file {file!r}. GGUF models there: "
            + (", ".join(f"{q} ({s / 1e9:.2f} GB)" for q, s in available_quants(files)) or "none"),
            param="model",
        )
    if not is_chat_gguf(path):
        raise ModelNotFoundError(f"{path} in {repo_id} is not a chat model GGUF file.", param="model")
    parts = next(parts for parts in gguf_groups(files).values() if path in parts)
    return gguf_selection(files, parts)


def vision_projector(files: dict[str, int], model_path: str) -> str | None:
    """The mmproj to pull with a GGUF: of those in its folder, the f16 one, else the only one (several
    in other precisions and no f16: none, rather than a guess)."""
    folder = model_path.rpartition("/")[0]
    found = sorted(
        p for p in files
        if p.rpartition("/")[0] == folder and p.lower().endswith(".gguf") and not is_chat_gguf(p)
    )  # fmt: skip
    f16 = [p for p in found if quant_of(p) == "F16"]
    return f16[0] if f16 else (found[0] if len(found) == 1 else None)


def gguf_selection(files: dict[str, int], parts: list[str]) -> Selection:
    """The model's parts, then its vision projector when the repo has one (the loader pairs it)."""
    projector = vision_projector(files, parts[0])
    paths = (*parts, projector) if projector else tuple(parts)
    return Selection("gguf", quant_of(parts[0]), paths, sum(files[p] for p in paths))
