"""Vision towers that turn pixel values into the text model's input embeddings."""
