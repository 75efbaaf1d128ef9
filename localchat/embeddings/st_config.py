"""What a sentence-transformers folder says about turning hidden states into one vector: the pooling
(`1_Pooling/config.json`), optional `Dense` projections, whether to L2-normalise (`modules.json`),
the longest input (`sentence_bert_config.json`) and the query/document prompts
(`config_sentence_transformers.json`). A plain transformers folder gets the defaults of its kind."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat.errors import ModelLoadError

POOLING_MODES = ("cls", "mean", "lasttoken")


@dataclass(frozen=True, slots=True)
class DenseLayer:
    """One `sentence_transformers.models.Dense` module: a linear map and its activation."""

    path: Path  # the module's folder (weights in model.safetensors or pytorch_model.bin)
    in_features: int
    out_features: int
    bias: bool
    activation: str  # "identity" or "tanh"


@dataclass(frozen=True, slots=True)
class SentenceConfig:
    pooling: str = "cls"  # one of POOLING_MODES
    dense: tuple[DenseLayer, ...] = ()
    normalize: bool = False
    max_seq_length: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    is_sentence_transformers: bool = False

    def prompt(self, name: str | None) -> str:
        """The text put before an input: the named prompt, else the default one, else nothing."""
        if name is not None:
            if name not in self.prompts:
                from localchat.errors import InvalidRequestError

                known = ", ".join(sorted(self.prompts)) or "none"
                raise InvalidRequestError(
                    f"This model has no prompt named {name!r} (it has: {known}).", param="input_type"
                )
            return self.prompts[name]
        return self.prompts.get(self.default_prompt_name or "", "")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot read {path}: {exc}") from exc


def _pooling_mode(cfg: dict[str, Any], path: Path) -> str:
    # NOTE: only the single modes are supported; max and mean_sqrt_len are rare in published models.
    if cfg.get("pooling_mode_cls_token"):
        return "cls"
    if cfg.get("pooling_mode_lasttoken"):
        return "lasttoken"
    if cfg.get("pooling_mode_mean_tokens"):
        return "mean"
    mode = cfg.get("pooling_mode")
    if mode in POOLING_MODES:
        return str(mode)
    raise ModelLoadError(f"{path}: unsupported pooling (only CLS, mean and last-token pooling are).")


_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
}


def _dense(folder: Path) -> DenseLayer:
    cfg = _read_json(folder / "config.json")
    activation = _ACTIVATIONS.get(str(cfg.get("activation_function", "torch.nn.modules.linear.Identity")))
    if activation is None:
        raise ModelLoadError(f"{folder}: unsupported Dense activation {cfg.get('activation_function')!r}.")
    return DenseLayer(
        folder, int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)), activation
    )


def read_sentence_config(folder: Path, default_pooling: str = "cls") -> SentenceConfig:
    """The folder's sentence-transformers settings; without `modules.json`, `default_pooling` and no
    normalisation (what transformers' own pipelines would give)."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return SentenceConfig(pooling=default_pooling)
    pooling = default_pooling
    dense: list[DenseLayer] = []
    normalize = False
    for module in _read_json(modules_file):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        sub = folder / str(module.get("path", ""))
        if kind == "Pooling":
            pooling = _pooling_mode(_read_json(sub / "config.json"), sub)
        elif kind == "Dense":
            dense.append(_dense(sub))
        elif kind == "Normalize":
            normalize = True
        elif kind not in ("Transformer", "StaticEmbedding") and kind:
            raise ModelLoadError(f"{folder}: unsupported sentence-transformers module {kind!r}.")
    max_len = None
    if (folder / "sentence_bert_config.json").is_file():
        value = _read_json(folder / "sentence_bert_config.json").get("max_seq_length")
        max_len = int(value) if value else None
    prompts: dict[str, str] = {}
    default_prompt = None
    if (folder / "config_sentence_transformers.json").is_file():
        st = _read_json(folder / "config_sentence_transformers.json")
        prompts = {str(k): str(v) for k, v in (st.get("prompts") or {}).items()}
        default_prompt = st.get("default_prompt_name") or None
    return SentenceConfig(
        pooling=pooling,
        dense=tuple(dense),
        normalize=normalize,
        max_seq_length=max_len,
        prompts=prompts,
        default_prompt_name=default_prompt,
        is_sentence_transformers=True,
    )
