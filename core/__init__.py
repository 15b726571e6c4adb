"""llmchat's engine: transport, SSE decoding, retries, caching, timing and the local server.

Nothing here imports Textual; the faces in ``llmchat.tui`` talk to the engine through the names below.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
