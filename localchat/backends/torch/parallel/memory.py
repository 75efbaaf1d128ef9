"""Does a rank's slice (tensor parallelism) or stage (pipeline, --gpu-layers) fit its GPU? Checked
before loading, so a model too big for N devices is one message that says what to change, not an
out-of-memory traceback on some rank halfway through."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from localchat.arch.moe import ffn_width
from localchat.arch.registry import architecture
from localchat.errors import BackendUnavailableError
from localchat.weights.config import ModelConfig

from .layer_split import stage_kv_layers, stage_state_layers

HEADROOM = 1.1  # the slice plus ~10% for the runtime and warm-up before the KV pool is sized


def checkpoint_bytes(path: Path) -> int:
    """The weights' size on disk (a GGUF file, or a folder's safetensors): a rank loads about 1/N."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir() else 0


def check_shard_fits(
    rank: int, device: str, world: int, total_bytes: int, free_bytes: int, sizes: list[int]
) -> None:
    """Raise when 1/world of `total_bytes` (with headroom) exceeds what `device` has free. `sizes`:
    the tensor-parallel sizes the model allows, to suggest one that fits."""
    need = total_bytes / world * HEADROOM
    if need <= free_bytes:
        return
    fits = [n for n in sizes if n > world and total_bytes / n * HEADROOM <= free_bytes]
    more = f"--tensor-parallel-size {fits[0]} (one GPU per rank)" if fits else "more GPUs"
    raise BackendUnavailableError(
        f"--tensor-parallel-size {world}: rank {rank}'s slice of the model needs about "
        f"{need / 2**30:.1f} GiB but {device} has {free_bytes / 2**30:.1f} GiB free. Use {more}, "
        "a smaller quantization (a Q4 GGUF file, or --isq q4), or free memory on that GPU."
    )


def check_device_memory(path: Path, device: torch.device, rank: int, world: int, sizes: list[int]) -> None:
    if device.type != "cuda":
        return  # CPU ranks share the machine's RAM and the file's page cache
    free, _ = torch.cuda.mem_get_info(device)
    check_shard_fits(rank, str(device), world, checkpoint_bytes(path), free, sizes)


# --- pipeline stages (`--pipeline-parallel-size`, `--gpu-layers`): a run of layers, not 1/N of each ---

MIN_KV_TOKENS = 2048  # a stage must also hold K/V for at least one conversation of this length
MIN_STATE_SLOTS = 1  # ... and, in hybrid models, its layers' state for that one sequence
KV_ELEMENT_BYTES = 2  # bf16/fp16 K/V (and the conv windows of hybrid state) on GPUs


@dataclass(frozen=True, slots=True)
class StageBytes:
    """What a stage holds: its weights, K/V per token of its K/V layers, state per sequence of its
    state layers (DeltaNet, short conv, Mamba-2: a fixed size per sequence, however long)."""

    weights: int
    kv_per_token: int
    state_per_slot: int

    def need(self) -> int:
        """Weights (+10%), K/V for MIN_KV_TOKENS and the state of MIN_STATE_SLOTS sequences."""
        return int(
            self.weights * HEADROOM
            + self.kv_per_token * MIN_KV_TOKENS
            + self.state_per_slot * MIN_STATE_SLOTS
        )


def _layer_params(config: ModelConfig) -> int:
    c = config
    attention = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    # Gemma 4 E2B / E4B: each layer's columns of the per-layer table and rows of its projection (the
    # stages cut both by layer), its gate and projection.
    ple = int(c.extra.get("hidden_size_per_layer_input") or 0)
    per_layer = ple * (int(c.extra.get("vocab_size_per_layer_input") or 0) + 3 * c.hidden_size)
    return attention + 3 * c.hidden_size * ffn_width(c) + per_layer


def state_bytes_per_slot(config: ModelConfig, layers: range) -> int:
    """One sequence's state over the state layers in `layers`: the family's per-sequence bytes (every
    state layer of a model is the same size) times the stage's share of those layers."""
    count, total = (
        stage_state_layers(config, layers),
        stage_state_layers(config, range(config.num_hidden_layers)),
    )
    estimate = architecture(config.model_type).state_bytes
    if not count or estimate is None:
        return 0
    return estimate(config, KV_ELEMENT_BYTES) * count // total


def stage_bytes(config: ModelConfig, layers: range, first: bool, last: bool, total_bytes: int) -> StageBytes:
    """A stage holding `layers`: the checkpoint's bytes per parameter times the stage's parameters (its
    layers, the embedding on the first stage, the LM head on the last, the embedding there too when
    tied); K/V per token of its K/V-keeping layers; state per sequence of its state layers."""
    table = config.vocab_size * config.hidden_size
    total_params = config.num_hidden_layers * _layer_params(config) + table * (
        1 if config.tie_word_embeddings else 2
    )
    per_param = total_bytes / max(total_params, 1)
    params = len(layers) * _layer_params(config)
    params += table if first or (last and config.tie_word_embeddings) else 0
    params += table if last and not config.tie_word_embeddings else 0
    kv_layers = stage_kv_layers(config, layers)
    kv_per_token = 2 * kv_layers * config.num_key_value_heads * config.head_dim * KV_ELEMENT_BYTES
    return StageBytes(int(params * per_param), kv_per_token, state_bytes_per_slot(config, layers))


def check_stage_bytes(
    config: ModelConfig,
    index: int,
    layers: range,
    last: bool,
    device: str,
    flag: str,
    total_bytes: int,
    free: int,
) -> None:
    """Raise when a stage's weights (+10%), K/V for MIN_KV_TOKENS and one sequence's state (hybrids)
    exceed `free` bytes on `device`."""
    size = stage_bytes(config, layers, index == 0, last, total_bytes)
    need = size.need()
    if need <= free:
        return
    state = ""
    if size.state_per_slot:
        state = (
            f" + {size.state_per_slot * MIN_STATE_SLOTS / 2**20:.1f} MiB of recurrent state for "
            f"{MIN_STATE_SLOTS} sequence in its {stage_state_layers(config, layers)} state layers"
        )
    raise BackendUnavailableError(
        f"{flag}: stage {index} (layers {layers.start}-{layers.stop - 1}) needs about {need / 2**30:.1f} GiB "
        f"({size.weights / 2**30:.1f} GiB of weights + K/V for {MIN_KV_TOKENS} tokens{state}) but {device} "
        f"has {free / 2**30:.1f} GiB free. Use more stages (a larger --pipeline-parallel-size), fewer "
        "--gpu-layers, a smaller quantization, or free memory on that GPU."
    )


def check_stage_fits(
    path: Path, config: ModelConfig, index: int, layers: range, last: bool, device: torch.device, flag: str
) -> None:
    """Before loading: does this CUDA stage's share fit its GPU? (CPU stages share the machine's RAM.)"""
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    check_stage_bytes(config, index, layers, last, str(device), flag, checkpoint_bytes(path), free)
