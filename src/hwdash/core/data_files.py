"""Where hwdash's packaged data files are, and reading one catalog TOML file with clear errors.

A foundation module (it imports nothing of hwdash but the errors): the catalog loader, the savers'
framework table, the LoRA module-name table and the synthetic models' reference shapes all read
files under :func:`packaged_catalog_dir`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hwdash.errors import CatalogError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def packaged_catalog_dir() -> Path:
    """The built-in catalog: the copy inside the wheel, else the repository's ``catalog/`` (editable)."""
    here = Path(__file__).resolve().parent.parent  # .../hwdash
    inside_wheel = here / "catalog"
    if inside_wheel.is_dir():
        return inside_wheel
    repository = here.parent.parent / "catalog"  # src/hwdash -> repo root
    if repository.is_dir():
        return repository
    raise CatalogError(here, "the built-in catalog is missing (reinstall hwdash)")


def read_catalog_toml(path: Path) -> dict[str, Any]:
    """The tables of one TOML file. Raises :class:`CatalogError` naming the file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(path, f"not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(path, f"cannot be read: {exc}") from None
    except RecursionError:
        raise CatalogError(path, "nested too deeply to be a catalog file") from None
    except ValueError as exc:  # an integer literal over Python's digit limit
        raise CatalogError(path, f"not usable TOML: {exc}") from None
    return dict(data)
