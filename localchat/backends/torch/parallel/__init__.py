"""Tensor parallelism (issue #33): one process per rank, each holding a slice of every layer's heads,
MLP columns and vocabulary; torch.distributed collectives join them (NCCL on CUDA, gloo on CPU).

group.py starts the process group with timeouts on every collective; shard.py cuts a loaded Llama
model down to one rank's slice and swaps in the layer/model forwards that all-reduce after the
row-parallel matmuls and all-gather the vocab-parallel logits.
"""
