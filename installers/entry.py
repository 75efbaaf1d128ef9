"""The frozen app's entry point (PyInstaller runs this file, not the package's console script)."""

import sys

from localchat.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
