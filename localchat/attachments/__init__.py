"""Files attached to a chat message in the web UI: pictures (kept as content-addressed files in the data
dir, sent to vision models) and documents (text and PDFs, whose text goes into the prompt)."""
