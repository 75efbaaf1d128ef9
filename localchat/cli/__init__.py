"""The `localchat` command: argument parsing and subcommands (`main`), the model commands, the terminal
chat and its slash commands, and finding a server that is already running."""
