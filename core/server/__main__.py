"""``python -m llmchat.core.server``: the local server without the rest of llmchat's command line."""

from __future__ import annotations

import sys

from llmchat.core.server._cli import main

sys.exit(main())
