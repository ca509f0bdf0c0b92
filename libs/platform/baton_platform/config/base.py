"""What every section of the configuration builds on: the error a bad file raises, the strict model
base (an unknown field is an error, not ignored), the host and port every HTTP service has, and
is_loopback, which the root model needs to decide whether an unauthenticated gateway is safe."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ConfigError(ValueError):
    """The configuration is invalid; the message names every offending field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _HttpService(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(ge=0, le=65535)


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other name may resolve to an address others reach
