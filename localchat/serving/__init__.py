"""The application layer below HTTP: engine assembly, the per-model `ServerContext`, request and
sampling resolution, prompts, reasoning and tool-call parsing. Used by the server, the terminal chat,
the conversation store and the model manager; it never imports `localchat.server`."""
