"""The desktop app: a native window (pywebview) over the server running in a background thread, one
instance per user, the gate that only lets the window in, its saved size and the self-test."""
