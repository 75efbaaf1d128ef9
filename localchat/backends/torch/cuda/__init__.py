"""The torch backend's CUDA-only parts: Triton attention and int4 kernels, CUDA graphs, 4-bit weights on
the GPU. Importing a module here never imports Triton at package import."""
