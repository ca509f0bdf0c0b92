from baton_platform.config import BatonConfig

from baton_router.conductor.base import ConductorBackend, Proposal
from baton_router.conductor.static import StaticConductor


def build_backend(config: BatonConfig) -> ConductorBackend:
    backend = config.conductor.backend
    if backend == "static":
        return StaticConductor(config.conductor.plan)
    raise ValueError(f"conductor.backend {backend!r} is not available")


__all__ = ["ConductorBackend", "Proposal", "StaticConductor", "build_backend"]
