"""The web UI's conversations: the SQLite store and its schema, export/import, and the chat service
that generates answers server-side and stores them as they stream."""
