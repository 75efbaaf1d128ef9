"""The MLX backend: the same runner contract as localchat/backends/torch, on Apple Metal (or MLX's CPU build)."""
