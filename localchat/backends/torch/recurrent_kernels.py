"""Whether the hybrid layers' decode rows take the Triton kernels (triton_recurrent.py) or the torch forms.

The same choice as the attention kernels' (kernel_choice.attention_kernel, `LOCALCHAT_TORCH_ATTENTION`):
Triton on CUDA when it imports, `torch` keeps the torch forms, `triton` forces the kernels (on a CPU only
under Triton's interpreter, as the tests run them). This module imports no Triton: callers import
triton_recurrent only once this says yes.
"""

from __future__ import annotations

import torch

from localchat.backends.torch.kernel_choice import attention_kernel
from localchat.config import backend_variable


def use_triton_recurrent(device: torch.device) -> bool:
    # Checked per layer and step: on a CPU, unless Triton is forced, one env read decides.
    if device.type == "cpu" and backend_variable("LOCALCHAT_TORCH_ATTENTION") != "triton":
        return False
    return attention_kernel(device) == "triton"
