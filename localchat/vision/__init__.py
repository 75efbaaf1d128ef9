"""Image input: decoding and preprocessing in numpy + Pillow (no torch here; the towers live in
localchat.backends.torch.vision)."""
