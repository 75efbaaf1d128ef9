"""The OpenAI-compatible API: one module per endpoint, with the request and answer helpers it uses."""
