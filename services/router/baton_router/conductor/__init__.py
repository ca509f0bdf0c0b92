from collections.abc import Sequence

from baton_conductor import ConductorOutputError
from baton_platform.config import ConductorConfig, WorkerConfig
from baton_router.conductor.base import ConductorBackend, Proposal
from baton_router.conductor.llm import ConductorUnavailable
from baton_router.conductor.static import StaticConductor


def build_backend(conductor: ConductorConfig, workers: Sequence[WorkerConfig]) -> ConductorBackend:
    """The configured conductor. Model-backed ones import their heavy packages (torch, vllm) and load
    their model only in `start()` or on the first `propose`, so building one is cheap."""
    backend = conductor.backend
    if backend == "static":
        return StaticConductor(conductor.plan, conductor.inner_plan)
    if backend == "transformers":
        from baton_router.conductor.transformers_backend import TransformersConductor

        return TransformersConductor(conductor, workers)
    if backend == "openai":
        from baton_router.conductor.openai_backend import OpenAIConductor

        return OpenAIConductor(conductor, workers)
    if backend == "vllm":
        from baton_router.conductor.vllm_backend import VllmConductor

        return VllmConductor(conductor, workers)
    if backend == "policy":
        from baton_router.conductor.policy_backend import PolicyConductor

        return PolicyConductor(conductor.policy, workers)
    raise ValueError(f"conductor.backend {backend!r} is not available")


__all__ = ["ConductorBackend", "ConductorOutputError", "ConductorUnavailable", "Proposal", "StaticConductor",
           "build_backend"]
