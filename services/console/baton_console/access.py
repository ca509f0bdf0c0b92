"""Who may read the console: a key with the `admin` scope, the gateway's keys and tenants being the
one list of keys. A browser signs in once with its key and then carries a session cookie that names
the key by its hash prefix and proves it with an HMAC under a secret this process drew at start (a
restart signs everyone out); a script may send `Authorization: Bearer KEY` instead. The key itself
is never stored, logged or put in the cookie."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping

from baton_platform.apikeys import hash_key, parse_key_entries
from baton_platform.config import BatonConfig

COOKIE = "baton_console"


class AdminKeys:
    def __init__(self, config: BatonConfig, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.open = config.gateway.auth == "none"
        entries = [(k.sha256, frozenset(k.scopes)) for t in config.tenants for k in t.keys]
        entries += [(digest, scopes) for _, digest, scopes in
                    parse_key_entries(env.get(config.gateway.keys_env, ""), config.gateway.keys_env)]
        self._digests = [digest for digest, scopes in entries if "admin" in scopes]
        self._secret = secrets.token_bytes(32)

    def _match(self, digest: str) -> str | None:
        found = None
        for known in self._digests:  # every hash is compared, in constant time
            if hmac.compare_digest(known.encode(), digest.encode()):
                found = known
        return found

    def key_digest(self, key: str) -> str | None:
        """The stored hash of `key` when it is an admin key, else None."""
        return self._match(hash_key(key)) if key else None

    def session(self, digest: str) -> str:
        """The cookie value that signs in the holder of the admin key with this hash."""
        return f"{digest[:12]}.{hmac.new(self._secret, digest.encode(), hashlib.sha256).hexdigest()}"

    def allows(self, authorization: str | None, cookie: str | None) -> bool:
        if self.open:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and self.key_digest(token.strip()):
            return True
        prefix, _, _ = (cookie or "").partition(".")
        return any(hmac.compare_digest(self.session(d), cookie or "") for d in self._digests if d.startswith(prefix))
