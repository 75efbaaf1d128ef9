"""Dedicated embedding and rerank models served beside the chat model: the sentence-transformers
folder layout (`st_config`), the tokenizer (`text`), the batching engine (`engine`), vector helpers
(`vectors`) and the loaded model (`model`). Nothing here imports torch: the encoders themselves live in
`localchat/backends/torch/encoders/`."""
