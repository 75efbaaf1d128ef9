"""`python -m localchat` runs the `localchat` command."""

from __future__ import annotations

import sys

from localchat.cli.main import main

sys.exit(main())
