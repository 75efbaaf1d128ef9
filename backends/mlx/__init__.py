"""The MLX backend: the same runner contract as backends/torch, on Apple Metal (or MLX's CPU build)."""
