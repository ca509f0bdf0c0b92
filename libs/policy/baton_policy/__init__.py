"""The fast routing policy (query -> workflow): the trainer fits it, the router serves it. Saved as a
directory (`Policy.save` / `Policy.load`) that any fsspec URL can hold (`local_copy`); what the router
loads from the bus it loads only from the policy store, and only when the content matches the
published digest (`verified_copy`)."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

# Written into a stored version after its digest is taken (the store's own record of it).
MANIFEST = "manifest.json"


def local_copy(uri: str) -> Path:
    """A local directory holding the policy at `uri` (a path, file:// or any fsspec URL)."""
    if "://" not in uri or uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    import fsspec

    target = Path(tempfile.mkdtemp(prefix="baton-policy-"))
    fs, path = fsspec.core.url_to_fs(uri)
    fs.get(path.rstrip("/") + "/", str(target), recursive=True)
    return target


def artefact_digest(directory: Path) -> str:
    """"sha256:..." over every file of a policy or adapter directory but its manifest: each file's path
    relative to the directory and the SHA-256 of its bytes, in path order."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(directory).rglob("*") if p.is_file() and p.name != MANIFEST):
        h.update(f.relative_to(directory).as_posix().encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return "sha256:" + h.hexdigest()


def in_store(uri: str, store: str) -> bool:
    """Whether `uri` names a version inside the policy store `store` (both paths, file:// or fsspec URLs)."""
    def parts(u: str) -> tuple[str, str, PurePosixPath]:
        if "://" not in u or u.startswith("file://"):
            return "file", "", PurePosixPath(str(Path(u.removeprefix("file://")).resolve()))
        s = urlsplit(u)
        return s.scheme, s.netloc, PurePosixPath(s.path or "/")

    (scheme, host, path), (root_scheme, root_host, root) = parts(uri), parts(store)
    return ".." not in PurePosixPath(uri).parts and (scheme, host) == (root_scheme, root_host) \
        and path != root and path.is_relative_to(root)


def verified_copy(uri: str, digest: str, store: str | None) -> Path:
    """A fresh local copy of the version at `uri`, refused (ValueError) unless `uri` is inside `store`
    (when one is configured) and the copy's content matches `digest`. The copy, not the store, is what
    gets loaded: the store could change between the check and the load."""
    if store is not None and not in_store(uri, store):
        raise ValueError(f"{uri!r} is not inside the policy store {store!r}")
    if not digest.startswith("sha256:"):
        raise ValueError("the update carries no sha256 digest of its artefact")
    target = Path(tempfile.mkdtemp(prefix="baton-policy-"))
    if "://" not in uri or uri.startswith("file://"):
        shutil.copytree(Path(uri.removeprefix("file://")), target, dirs_exist_ok=True)
    else:
        import fsspec

        fs, path = fsspec.core.url_to_fs(uri)
        fs.get(path.rstrip("/") + "/", str(target), recursive=True)
    found = artefact_digest(target)
    if found != digest:
        shutil.rmtree(target, ignore_errors=True)
        raise ValueError(f"the content at {uri!r} is {found}, not the published {digest}")
    return target
