"""Vision towers on MLX (the twins of localchat/backends/torch/vision/)."""
