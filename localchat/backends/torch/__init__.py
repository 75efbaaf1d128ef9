"""PyTorch backend: paged-KV model runner for CUDA, MPS and CPU. Entry point: `entry.create_runner`."""
