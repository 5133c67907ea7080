"""`kit data fetch neusight`: download NeuSight's data, pinned and hash-checked (filled in below)."""
from __future__ import annotations

from pathlib import Path

NEUSIGHT_REPO = "sitar-lab/NeuSight"
NEUSIGHT_COMMIT = "6945927d9afcca2b9daf021f8395e53edc5b4eef"


def fetched_dir() -> Path:
    """Where `kit data fetch neusight` puts the files by default."""
    from kit.data.cache import cache_dir

    return cache_dir() / f"neusight-{NEUSIGHT_COMMIT[:12]}"
