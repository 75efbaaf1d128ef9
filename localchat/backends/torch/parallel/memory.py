"""Does a rank's slice fit its GPU? Checked before loading, so a model too big for N devices is one
message that says what to change, not an out-of-memory traceback on some rank halfway through."""

from __future__ import annotations

from pathlib import Path

import torch

from localchat.errors import BackendUnavailableError

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
