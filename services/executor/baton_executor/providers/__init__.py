"""LLM provider adapters: one per API, behind one contract, sharing the executor's HTTP client."""

from .base import Provider, ProviderCall, ProviderError, ProviderReply
from .registry import PROVIDER_KINDS, build_provider

__all__ = [
    "PROVIDER_KINDS",
    "Provider",
    "ProviderCall",
    "ProviderError",
    "ProviderReply",
    "build_provider",
]
