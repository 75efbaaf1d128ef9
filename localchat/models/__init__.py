"""Model lifecycle above the files on disk (`localchat.hub`): the catalog (`models.yaml`), what a name
means locally, RAM estimates, downloads the server runs, the packaged default model, and the manager
that loads, switches and unloads models for the server."""
