"""Where a model's layers are cut into stages (`--pipeline-parallel-size`, `--gpu-layers`), and what
must not be cut: which families' layer loops a stage can run, which layers keep K/V, and Gemma 4's
K/V-sharing layers, which must share a stage with the layer whose keys and values they read."""

from __future__ import annotations

from pathlib import Path

from localchat.arch.gemma4 import kv_sources
from localchat.backends.torch.models import model_class
from localchat.errors import BackendUnavailableError
from localchat.vision.model_info import vision_config
from localchat.weights.config import ModelConfig

_MODELS = "localchat.backends.torch.models."
# Layer loops a stage can run as they are: each walks `self.layers` from `embed_tokens`, taking the next
# K/V cache (and, in hybrids, the next state-slot layer) as it meets a layer that keeps one, so a
# stage's cut-down layer list with its own caches and state pool runs the family's code unchanged.
STAGE_LOOPS = frozenset(
    _MODELS + name
    for name in (
        "base.DecoderLM.hidden_states",
        "qwen_vl.VisionLanguage.hidden_states",
        "gemma.Model.hidden_states",  # Gemma 2 / 3: sliding and global layers, a RoPE base per kind
        "gemma4.Model.hidden_states",  # its layer kinds and cache indices are re-made per stage
        "smollm3.Model.hidden_states",  # NoPE layers
        "ministral3.Model.hidden_states",  # per-token q temperature
        "llama4.Model.hidden_states",  # NoPE layers, temperature tuning
        "qwen3_next.Model.hidden_states",  # Qwen3-Next, Qwen3.5 (gated DeltaNet + attention)
        "lfm2.Model.hidden_states",  # LFM2 (short conv + attention)
        "mamba_hybrid.Model.hidden_states",  # Granite 4.0-H, Nemotron-H (Mamba-2 + attention + MLP)
    )
)
# Layer kinds that keep a per-sequence state slot, or nothing at all, instead of K/V.
NO_KV_KINDS = frozenset({"linear_attention", "conv", "mamba", "mlp"})
STATE_KINDS = NO_KV_KINDS - {"mlp"}


def split_layers(num_layers: int, stages: int) -> list[range]:
    """Contiguous runs balanced by layer count (sizes differ by at most one). The earlier stages take
    the extra layers: the last one also runs the LM head, the largest matmul of a decode step."""
    base, extra = divmod(num_layers, stages)
    runs, start = [], 0
    for i in range(stages):
        count = base + (1 if i < extra else 0)
        runs.append(range(start, start + count))
        start += count
    return runs


def check_stageable(config: ModelConfig, flag: str) -> None:
    """A clear error, before any weight is read, for models this layer split does not cover."""
    loop = model_class(config.model_type).hidden_states
    if f"{loop.__module__}.{loop.__qualname__}" not in STAGE_LOOPS:
        raise BackendUnavailableError(
            f"{flag}: {config.model_type!r} runs its layers its own way, which the layer split does "
            "not cover yet; run it on one device (drop the flag)."
        )


def kv_spans(config: ModelConfig) -> list[tuple[int, int]]:
    """(source, reader) pairs that must share a stage: Gemma 4's K/V-sharing layers attend over this
    step's keys and values of an earlier layer (and its cache), which exist only where that layer runs."""
    if "gemma4" not in config.model_type:
        return []
    return [(source, i) for i, source in enumerate(kv_sources(config)) if source != i]


def allowed_cuts(config: ModelConfig) -> list[int]:
    """Stage boundaries (a stage starting at layer c) that keep every (source, reader) pair together."""
    spans = kv_spans(config)
    return [c for c in range(1, config.num_hidden_layers) if not any(s < c <= r for s, r in spans)]


def stage_runs(config: ModelConfig, stages: int, flag: str) -> list[range]:
    """The split a pipeline uses: split_layers' balance, or, when K/V-sharing layers rule some
    boundaries out (Gemma 4 E2B / E4B: the last 20 layers read layers 13 and 14's K/V), the contiguous
    split at allowed boundaries whose largest stage is smallest (earlier stages take ties)."""
    layers = config.num_hidden_layers
    cuts = allowed_cuts(config)
    if len(cuts) == layers - 1:
        return split_layers(layers, stages)
    if len(cuts) < stages - 1:
        spans = kv_spans(config)
        first, last = min(s for s, _ in spans), max(r for _, r in spans)
        most = (
            f"splits into at most {len(cuts) + 1} stages: use --pipeline-parallel-size {len(cuts) + 1} or fewer"
            if cuts
            else "cannot be split: run it on one device (drop the flag)"
        )
        raise BackendUnavailableError(
            f"{flag}: Gemma 4 layers {first}-{last} must share a stage (the later ones reuse the keys and "
            f"values of layers before them), so this {layers}-layer model {most}."
        )
    return _balanced_runs(layers, stages, cuts)


def _balanced_runs(layers: int, stages: int, cuts: list[int]) -> list[range]:
    """Stages split only at `cuts`, minimising the largest; among equals, the earlier boundaries as
    late as possible (the earlier stages larger, as split_layers has them)."""
    bounds = [0, *cuts, layers]
    # best[k][j]: the smallest largest stage covering layers [0, bounds[j]) with k stages (and its cut).
    inf = layers + 1
    best = [[(inf, -1)] * len(bounds) for _ in range(stages + 1)]
    best[0][0] = (0, -1)
    for k in range(1, stages + 1):
        for j in range(1, len(bounds)):
            for i in range(j - 1, -1, -1):  # the later cut first: ties keep it
                worst = max(best[k - 1][i][0], bounds[j] - bounds[i])
                if worst < best[k][j][0]:
                    best[k][j] = (worst, i)
    runs, j = [], len(bounds) - 1
    for k in range(stages, 0, -1):
        i = best[k][j][1]
        runs.append(range(bounds[i], bounds[j]))
        j = i
    return runs[::-1]


def check_split(config: ModelConfig, runs: list[range], flag: str, path: Path | None = None) -> None:
    """What must stay inside one stage: Gemma 4's K/V-sharing layers and the earlier layer whose keys
    and values of this step they attend over (stage_runs picks boundaries that keep them; a boundary
    given by --gpu-layers is checked here); Qwen3-VL's DeepStack layers (the picture's middle-layer
    rows are added after each of the first layers, on the stage that makes the embeddings)."""
    for source, reader in kv_spans(config):
        for run in runs:
            if reader in run and source not in run:
                layers = config.num_hidden_layers
                counts = sorted([0, layers] + [layers - c for c in allowed_cuts(config)])
                raise BackendUnavailableError(
                    f"{flag}: Gemma 4 layer {reader} reuses the keys and values of layer {source}, which "
                    f"this split puts in another stage (layers {run.start}-{run.stop - 1} together); use a "
                    f"split that keeps them together (for this model --gpu-layers {_spans(counts)}), or "
                    "run the model on one device."
                )
    vision = (vision_config(path) or {}).get("vision_config") if path is not None else None
    deepstack = len((vision or {}).get("deepstack_visual_indexes") or ())
    if deepstack > len(runs[0]):
        raise BackendUnavailableError(
            f"{flag}: the picture rows of this model's DeepStack are added after each of its first "
            f"{deepstack} layers, all on the first stage, which holds {len(runs[0])}; use fewer stages "
            "(or fewer --gpu-layers), or run the model on one device."
        )


def _spans(numbers: list[int]) -> str:
    """[0, 3, 4, 5, 7] -> "0, 3-5, 7"."""
    parts: list[str] = []
    for n in numbers:
        if parts and n - 1 == int(parts[-1].rpartition("-")[2]):
            parts[-1] = f"{parts[-1].partition('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


def _kinds(config: ModelConfig) -> list[str] | None:
    return config.extra.get("block_kinds") or config.extra.get("layer_types")  # Mamba-2 hybrids: block_kinds


def keeps_kv(config: ModelConfig, index: int) -> bool:
    """Does layer `index` write the paged K/V cache (rather than a state slot, or nothing, or, in
    Gemma 4, another layer's cache)?"""
    kinds = _kinds(config)
    if kinds and kinds[index] in NO_KV_KINDS:
        return False
    return all(reader != index for _, reader in kv_spans(config))


def stage_kv_layers(config: ModelConfig, layers: range) -> int:
    return sum(1 for index in layers if keeps_kv(config, index))


def stage_state_layers(config: ModelConfig, layers: range) -> int:
    """The layers of `layers` that keep a per-sequence state slot (DeltaNet, short conv, Mamba-2)."""
    kinds = _kinds(config)
    return sum(1 for index in layers if kinds and kinds[index] in STATE_KINDS)
