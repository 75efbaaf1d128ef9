"""Dedicated embedding and rerank models served beside the chat model: the sentence-transformers
folder layout (`st_config`), the tokenizer (`text`), the batching engine (`engine`), vector helpers
(`vectors`) and the loaded model (`model`). Nothing here imports torch: the encoders themselves live in
`localchat/backends/torch/encoders/`."""

# Hugging Face model types of the encoders localchat runs for embeddings and reranking (the catalog's
# embedding/rerank entries name one of these); GGUF files: llama.cpp's `bert` and `nomic-bert`.
ENCODER_MODEL_TYPES = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "camembert",
        "nomic_bert",
        "modernbert",
        "gemma3_text",
        "qwen2",
        "qwen3",
    }
)
