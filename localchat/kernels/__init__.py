"""localchat's compiled CPU kernels (csrc/) seen from Python, with neither torch nor MLX.

- `blocks`: the GGUF block geometry of every type the kernels read (from `gguf.GGML_QUANT_SIZES`).
- `library`: the one ctypes binding of the extension `localchat._lckernels`, the ISA and layout choices.
- `step`: the ctypes mirror of csrc/lc_step.h's structs (the fused decode step's layer table).

The torch backend's `kernels.py` runs them on tensors; the memory estimate sizes the x16 layout with
them before anything loads.
"""
