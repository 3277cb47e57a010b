"""Where the toolkit keeps what it measures or compiles once per machine ($TOOLKIT_CACHE to move it)."""

import os
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("TOOLKIT_CACHE", Path.home() / ".cache" / "llm-deploy-toolkit"))
