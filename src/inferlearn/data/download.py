"""Download a file with a progress bar into a temporary file, then move it into place atomically."""
from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from tqdm.auto import tqdm

from ..atomic import atomic_path
from ..errors import DataError


def download(url: str, path: Path, progress: bool = True, timeout: float = 60.0) -> Path:
    """Fetch ``url`` into ``path`` (atomic: an interrupted download leaves no partial file).

    Raises:
        DataError: on any network or file error, naming the URL.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, atomic_path(path) as tmp:
            total = int(response.headers.get("Content-Length") or 0) or None
            with open(tmp, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=path.name,
                                              disable=not progress, leave=False) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
                out.flush()
                os.fsync(out.fileno())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DataError(f"Could not download {url}: {exc}") from exc
    return path
