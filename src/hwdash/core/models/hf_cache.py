"""Models in the local Hugging Face cache, found offline.

``--model org/name`` that is not in hwdash's catalog is looked up in the cache the Hugging Face
libraries fill (``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``) with
huggingface_hub's own cache functions (``try_to_load_from_cache`` follows ``refs/main`` to its
snapshot; ``scan_cache_dir`` lists what is there). Nothing here touches the network.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

#: A Hugging Face repository id: ``org/name``.
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cache_dir() -> Path:
    """Where the Hugging Face cache is, read from the environment now (not at import time)."""
    hub = os.environ.get("HF_HUB_CACHE", "").strip()
    if hub:
        return Path(hub).expanduser()
    home = os.environ.get("HF_HOME", "").strip()
    base = Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface"
    return base / "hub"


def cached_config(repo_id: str) -> Path | None:
    """The cached ``config.json`` of ``repo_id`` (its ``main`` snapshot), or None."""
    if not REPO_ID.match(repo_id):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency; absent only in odd installs
        return None
    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(cache_dir()))
    return Path(found) if isinstance(found, str) else None


def cached_model_ids() -> list[str]:
    """Model repositories in the cache that hold a ``config.json`` (sorted)."""
    directory = cache_dir()
    if not directory.is_dir():
        return []
    try:
        from huggingface_hub import scan_cache_dir
    except ImportError:  # pragma: no cover
        return []
    try:
        info = scan_cache_dir(directory)
    except Exception:  # a damaged cache lists nothing rather than ending the command
        return []
    ids = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        if any(file.file_name == "config.json" for rev in repo.revisions for file in rev.files):
            ids.append(repo.repo_id)
    return sorted(ids)
