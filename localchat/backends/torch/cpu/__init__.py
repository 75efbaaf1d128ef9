"""The torch backend's CPU-only parts: localchat's compiled kernels on torch tensors, the fused decode
step, the CPU attention paths and thread and oneDNN tuning."""
