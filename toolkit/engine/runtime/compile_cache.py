"""Where torch.compile keeps what it compiled, so that the engine's second start skips the work."""

from __future__ import annotations

import os
from pathlib import Path


def inductor_cache_dir(explicit: str | Path | None = None) -> Path:
    """Point Inductor's on-disk cache at `explicit`, else $TORCHINDUCTOR_CACHE_DIR if the user set one,
    else <toolkit cache root>/inductor. Call before the first torch.compile of the process."""
    if explicit is not None:
        path = Path(explicit)
    elif os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        path = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    else:
        from toolkit.cache import CACHE_ROOT

        path = CACHE_ROOT / "inductor"
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path
