"""The conductor behind any OpenAI-compatible Chat Completions server: `vllm serve`, or a hosted model.

Each plan is one POST /chat/completions with `response_format` json_schema (the bounded plan schema,
strict) and `logprobs: true`; the token log-probs come from `choices[0].logprobs.content`. `vllm serve` reports
them after the schema mask and before temperature, as every backend records them (see `llm`); a
hosted API reports what its provider computes. Which distribution the server sampled from is not
known here, so the propensity is unknown unless decoding is greedy (temperature 0: log 1 = 0).

`policy_models` maps a request's policy name to the model to ask for, so LoRA adapters registered with
`vllm serve --lora-modules name=path` serve as policy versions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import httpx

from baton.v1 import requests_pb2
from baton_conductor import plan_json_schema
from baton_platform.config import ConductorConfig, WorkerConfig
from baton_router.conductor.base import Proposal
from baton_router.conductor.llm import PlanPrompter, log_propensity


class ConductorServerError(RuntimeError):
    """The conductor's server refused or failed the request, or answered in an unexpected shape."""


class OpenAIConductor:
    name = "openai"

    def __init__(self, conductor: ConductorConfig, workers: Sequence[WorkerConfig],
                 client: httpx.AsyncClient | None = None) -> None:
        settings = conductor.openai
        if settings is None:
            raise ValueError("conductor.openai settings are missing")
        self.settings = settings
        self.prompter = PlanPrompter(conductor, workers)
        self._schemas = {b: plan_json_schema(b) for b in (self.prompter.bounds, self.prompter.inner_bounds)}
        headers = {}
        if settings.api_key_env:
            key = os.environ.get(settings.api_key_env)
            if not key:
                raise ValueError(f"conductor.openai.api_key_env names {settings.api_key_env}, which is not set")
            headers["Authorization"] = f"Bearer {key}"
        self._client = client or httpx.AsyncClient(timeout=settings.timeout_s)
        self._headers = headers
        self._url = settings.base_url.rstrip("/") + "/chat/completions"

    @property
    def ready(self) -> bool:
        return True

    async def start(self) -> None:
        return None

    def model_for(self, policy: str) -> str:
        return self.settings.policy_models.get(policy, self.settings.model)

    def request_body(self, request: requests_pb2.ChatRequest) -> dict:
        return {
            "model": self.model_for(request.policy),
            "messages": self.prompter.messages(request),
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "conductor_plan", "schema": self._schemas[self.prompter.bounds_for(request)],
                                "strict": True},
            },
            "logprobs": True,
            "temperature": self.settings.temperature,
            # OpenAI's current name for the limit; vLLM takes it as well.
            "max_completion_tokens": self.settings.max_tokens,
            "n": 1,
        }

    async def propose(self, request: requests_pb2.ChatRequest) -> Proposal:
        body = self.request_body(request)
        try:
            response = await self._client.post(self._url, json=body, headers=self._headers,
                                               timeout=self.settings.timeout_s)
        except httpx.HTTPError as e:
            raise ConductorServerError(f"conductor server {self._url} unreachable: {type(e).__name__}: {e}") from e
        if response.status_code != 200:
            raise ConductorServerError(
                f"conductor server answered HTTP {response.status_code}: {_error_message(response)}")
        try:
            choice = response.json()["choices"][0]
            text = choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ConductorServerError(f"conductor server sent no chat completion: {response.text[:300]!r}") from e
        content = ((choice.get("logprobs") or {}).get("content")) or []
        logprobs = [float(t["logprob"]) for t in content if t.get("logprob") is not None]
        log_prop = log_propensity(None, self.settings.temperature)
        return self.prompter.proposal(text or "", logprobs, log_prop, body["model"], self.prompter.bounds_for(request))

    async def aclose(self) -> None:
        await self._client.aclose()


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
    except ValueError:
        return response.text[:300]
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error or response.text[:300])
