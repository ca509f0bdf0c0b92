"""The fast routing policy (query -> workflow): the trainer fits it, the router serves it. Saved as a
directory (`Policy.save` / `Policy.load`) that any fsspec URL can hold (`local_copy`)."""

from __future__ import annotations

import tempfile
from pathlib import Path


def local_copy(uri: str) -> Path:
    """A local directory holding the policy at `uri` (a path, file:// or any fsspec URL)."""
    if "://" not in uri or uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    import fsspec

    target = Path(tempfile.mkdtemp(prefix="baton-policy-"))
    fs, path = fsspec.core.url_to_fs(uri)
    fs.get(path.rstrip("/") + "/", str(target), recursive=True)
    return target
