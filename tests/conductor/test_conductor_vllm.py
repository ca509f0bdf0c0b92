"""The 'vllm' conductor's own logic, which runs without vLLM: policy names to LoRA adapters, switching
adapters at run time, what is handed to the engine, and the error when vLLM is missing.

vLLM cannot be installed on a CPU machine, so the engine and vLLM's parameter classes are stand-ins
that only record what they are given; the engine itself is exercised by
`baton_router.conductor.gpu_check` on a GPU machine.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from baton.v1 import common_pb2, requests_pb2

from baton_platform.config import BatonConfig
from baton_router.conductor import ConductorUnavailable, build_backend
from baton_router.conductor.vllm_backend import Adapter, VllmConductor
from baton_workflow import plan_problems
from testbed import default_config_data

PLAN = '{"model_id": [2, 0], "subtasks": ["Draft an answer.", "Check the draft."], "access_list": [[], [0]]}'


@dataclass
class Recorded:
    """Stands in for vLLM's parameter classes: keeps the arguments."""

    args: tuple
    kwargs: dict


def recorder(name):
    return type(name, (), {"__init__": lambda self, *a, **k: setattr(self, "call", Recorded(a, k))})


API = SimpleNamespace(SamplingParams=recorder("SamplingParams"),
                      StructuredOutputsParams=recorder("StructuredOutputsParams"),
                      LoRARequest=recorder("LoRARequest"),
                      RequestOutputKind=SimpleNamespace(FINAL_ONLY="final-only"))


class Tokenizer:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize and add_generation_prompt
        return {"input_ids": [1, 2, 3, len(messages)]}


@dataclass
class Engine:
    text: str = PLAN
    loaded: list = field(default_factory=list)
    removed: list = field(default_factory=list)
    generated: list = field(default_factory=list)

    def get_tokenizer(self):
        return Tokenizer()

    async def add_lora(self, lora):
        self.loaded.append(lora.call.args)
        return True

    async def remove_lora(self, lora_id):
        self.removed.append(lora_id)
        return True

    async def generate(self, prompt, params, request_id, *, lora_request=None):
        self.generated.append({"prompt": prompt, "params": params, "request_id": request_id,
                               "lora": lora_request.call.args if lora_request else None})
        ids = [10, 11, 12, 2]
        # One {token id: Logprob} map per position; position 1 also carries a runner-up token.
        logprobs = [{10: SimpleNamespace(logprob=-0.25)},
                    {11: SimpleNamespace(logprob=-1.0), 7: SimpleNamespace(logprob=-0.1)},
                    {12: SimpleNamespace(logprob=-0.5)}, {2: SimpleNamespace(logprob=0.0)}]
        yield SimpleNamespace(finished=True, outputs=[SimpleNamespace(text=self.text, token_ids=ids, logprobs=logprobs,
                                                                      finish_reason="stop")])

    def shutdown(self):
        pass


def vllm_config(**vllm) -> BatonConfig:
    data = default_config_data()
    data["conductor"] = {"backend": "vllm", "max_steps": 3,
                         "vllm": {"model": "/models/conductor-7b",
                                  "adapters": {"v1": "/adapters/v1", "v2": "/adapters/v2"},
                                  "default_adapter": "v1", "temperature": 0.9, **vllm}}
    return BatonConfig(**data)


def ask(policy: str) -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(request_id="q7", policy=policy, messages=[
        common_pb2.ChatMessage(role="user", content="Integrate x^2 from 0 to 3.")])


def test_policy_names_map_to_lora_adapters_with_a_default():
    conductor = VllmConductor(vllm_config(), engine=Engine(), api=API)
    assert conductor.adapter_for("v2") == Adapter("v2", 2, "/adapters/v2")
    assert conductor.adapter_for("v1") == Adapter("v1", 1, "/adapters/v1")
    assert conductor.adapter_for("baton") == conductor.adapter_for("v1"), "the default policy gets the default adapter"
    conductor.set_default(None)
    assert conductor.adapter_for("baton") is None, "no default: the base model"
    with pytest.raises(KeyError, match="no adapter named 'v9'"):
        conductor.set_default("v9")


async def test_adapters_are_loaded_at_start_and_switched_at_run_time():
    engine = Engine()
    conductor = VllmConductor(vllm_config(), engine=engine, api=API)
    assert not conductor.ready
    await conductor.start()
    assert conductor.ready
    assert engine.loaded == [("v1", 1, "/adapters/v1"), ("v2", 2, "/adapters/v2")]

    await conductor.load_adapter("v3", "/adapters/v3")
    conductor.set_default("v3")
    assert engine.loaded[-1] == ("v3", 3, "/adapters/v3")
    proposal = await conductor.propose(ask("baton"))
    assert proposal.policy_version == "v3" and engine.generated[-1]["lora"] == ("v3", 3, "/adapters/v3")

    # New weights under an old name get a new id (vLLM caches by id) and the old id is dropped.
    await conductor.load_adapter("v2", "/adapters/v2-retrained")
    assert conductor.adapter_for("v2") == Adapter("v2", 4, "/adapters/v2-retrained") and engine.removed == [2]
    assert (await conductor.propose(ask("v2"))).policy_version == "v2"
    assert engine.generated[-1]["lora"] == ("v2", 4, "/adapters/v2-retrained")
    await conductor.aclose()


async def test_the_engine_gets_the_schema_the_chat_prompt_and_asks_for_log_probs():
    engine = Engine()
    config = vllm_config(default_adapter=None)
    conductor = VllmConductor(config, engine=engine, api=API)
    proposal = await conductor.propose(ask("baton"))
    names = [w.name for w in config.workers]
    assert proposal.plan.workers == ["llama-70b", "gemini-pro"] and plan_problems(proposal.plan, names, 3) == []
    assert proposal.token_logprobs == [-0.25, -1.0, -0.5, 0.0], "the sampled token's log-prob at each position"
    assert proposal.propensity == 0.0, "at temperature 0.9 the sampling distribution is not the reported one"
    assert proposal.policy_version == "conductor-7b"

    sent = engine.generated[-1]
    assert sent["prompt"] == {"prompt_token_ids": [1, 2, 3, 2]} and sent["lora"] is None
    assert sent["request_id"].startswith("q7-")
    params = sent["params"].call.kwargs
    assert params["temperature"] == 0.9 and params["logprobs"] == 0 and params["output_kind"] == "final-only"
    assert (params["top_p"], params["top_k"]) == (1.0, 0)
    structured = params["structured_outputs"].call.kwargs
    assert structured["json"]["properties"]["model_id"]["items"]["maximum"] == len(names), "workers, then the conductor"
    assert structured["json"]["properties"]["subtasks"]["maxItems"] == 3
    assert structured["disable_any_whitespace"] is True

    grammar = VllmConductor(vllm_config(constraint="grammar"), engine=Engine(), api=API)
    await grammar.propose(ask("v1"))
    structured = grammar._engine.generated[-1]["params"].call.kwargs["structured_outputs"].call.kwargs
    assert "plan3 ::=" in structured["grammar"] and "json" not in structured


async def test_without_vllm_starting_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail, as on a CPU machine
    conductor = build_backend(vllm_config())
    with pytest.raises(ConductorUnavailable, match=r"needs the `vllm` package.*'transformers' backend"):
        await conductor.propose(ask("baton"))
    assert not conductor.ready
    await conductor.aclose()


async def test_at_temperature_one_the_reported_log_probs_give_the_propensity():
    conductor = VllmConductor(vllm_config(temperature=1.0), engine=Engine(), api=API)
    proposal = await conductor.propose(ask("v2"))
    assert proposal.propensity == pytest.approx(math.exp(-0.25 - 1.0 - 0.5 + 0.0))
    greedy = VllmConductor(vllm_config(temperature=0.0), engine=Engine(), api=API)
    assert (await greedy.propose(ask("v2"))).propensity == 1.0
