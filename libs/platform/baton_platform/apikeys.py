"""Gateway API keys as Baton stores them: by SHA-256 hash only, so a configuration, a Secret or a
log that leaks holds nothing a caller could present. `baton keys create` mints keys; the gateway
checks them (baton_gateway.auth)."""

from __future__ import annotations

import hashlib
import re
import secrets

from baton_platform.config import SCOPES, TENANT_NAME, ConfigError

KEY_PREFIX = "bt-"
_ENTRY = re.compile(r"^(?P<tenant>[^:\s]+):(?P<hash>[0-9a-fA-F]{64})(?::(?P<scopes>[a-z+]+))?$")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def mint_key() -> str:
    """A new key: 256 random bits, prefixed so secret scanners and people can recognise it."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_entry(tenant: str, digest: str, scopes: list[str] | tuple[str, ...]) -> str:
    """One key in the form gateway.keys_env holds: tenant:sha256[:scope+scope]."""
    return f"{tenant}:{digest}:{'+'.join(scopes)}"


def parse_key_entries(text: str, variable: str) -> list[tuple[str, str, frozenset[str]]]:
    """`tenant:sha256hex[:scope+scope]` entries separated by commas or whitespace; no scopes means
    `chat`. An error names the bad entry by position only: a plaintext key put here by mistake must
    not reach a log."""
    out = []
    for i, raw in enumerate(e for e in re.split(r"[,\s]+", text) if e):
        m = _ENTRY.match(raw)
        if m is None or not re.match(TENANT_NAME, m["tenant"]):
            raise ConfigError(f"{variable}: entry {i + 1} is not `tenant:sha256hex[:scope+scope]` (it holds key "
                              "hashes, not keys: `baton keys create --tenant NAME` prints one)")
        scopes = frozenset((m["scopes"] or "chat").split("+"))
        if not scopes <= set(SCOPES):
            raise ConfigError(f"{variable}: entry {i + 1} names unknown scopes; known: {', '.join(SCOPES)}")
        out.append((m["tenant"], m["hash"].lower(), scopes))
    return out
