from baton_conductor import ConductorOutputError
from baton_platform.config import BatonConfig
from baton_router.conductor.base import ConductorBackend, Proposal
from baton_router.conductor.common import ConductorUnavailable
from baton_router.conductor.static import StaticConductor


def build_backend(config: BatonConfig) -> ConductorBackend:
    """The configured conductor. Model-backed ones import their heavy packages (torch, vllm) and load
    their model only in `start()` or on the first `propose`, so building one is cheap."""
    backend = config.conductor.backend
    if backend == "static":
        return StaticConductor(config.conductor.plan, config.conductor.inner_plan)
    if backend == "transformers":
        from baton_router.conductor.transformers_backend import TransformersConductor

        return TransformersConductor(config)
    if backend == "openai":
        from baton_router.conductor.openai_backend import OpenAIConductor

        return OpenAIConductor(config)
    if backend == "vllm":
        from baton_router.conductor.vllm_backend import VllmConductor

        return VllmConductor(config)
    if backend == "policy":
        from baton_router.conductor.policy_backend import PolicyConductor

        return PolicyConductor(config)
    raise ValueError(f"conductor.backend {backend!r} is not available")


__all__ = ["ConductorBackend", "ConductorOutputError", "ConductorUnavailable", "Proposal", "StaticConductor",
           "build_backend"]
