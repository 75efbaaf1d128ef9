"""`python -m localchat` runs the `localchat` command."""

from __future__ import annotations

import sys

from localchat.cli import main

sys.exit(main())
