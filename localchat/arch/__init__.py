"""Backend-neutral architecture facts: which model types exist, how their configs, weight names and
RoPE work. Backends read these and keep only their own compute (`localchat/backends/<lib>/models/`)."""

from localchat.arch.architecture import Architecture
from localchat.arch.registry import ARCHITECTURES, SUPPORTED_MODEL_TYPES, architecture
from localchat.arch.rope import ROPE_TYPES, rope_inv_freq

__all__ = [
    "ARCHITECTURES",
    "ROPE_TYPES",
    "SUPPORTED_MODEL_TYPES",
    "Architecture",
    "architecture",
    "rope_inv_freq",
]
