"""The 'vllm' conductor's own logic, which runs without vLLM: policy names to LoRA adapters, switching
adapters at run time, what is handed to the engine, and the error when vLLM is missing.

vLLM is not in the workspace environment, so here the engine and vLLM's parameter classes are
stand-ins that only record what they are given (and can refuse an adapter). The real engine, vLLM's
CPU build, is exercised by test_conductor_vllm_engine.py and tests/e2e/test_vllm_conductor.py.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from testbed import default_config_data, pool

from baton.v1 import common_pb2, requests_pb2
from baton_platform.config import BatonConfig
from baton_router.conductor import ConductorUnavailable, build_backend
from baton_router.conductor.vllm_backend import Adapter, AdapterRejected, VllmConductor
from baton_router.planning import Planner
from baton_workflow import plan_problems

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
                      RequestOutputKind=SimpleNamespace(FINAL_ONLY="final-only"), on_cpu=True)


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
    refuse: set = field(default_factory=set)  # adapter paths add_lora answers False for, as vLLM may

    def get_tokenizer(self):
        return Tokenizer()

    async def add_lora(self, lora):
        if lora.call.args[2] in self.refuse:
            return False
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
    conductor = VllmConductor(*pool(vllm_config()), engine=Engine(), api=API)
    assert conductor.adapter_for("v2") == Adapter("v2", 2, "/adapters/v2")
    assert conductor.adapter_for("v1") == Adapter("v1", 1, "/adapters/v1")
    assert conductor.adapter_for("baton") == conductor.adapter_for("v1"), "the default policy gets the default adapter"
    conductor.set_default(None)
    assert conductor.adapter_for("baton") is None, "no default: the base model"
    with pytest.raises(KeyError, match="no adapter named 'v9'"):
        conductor.set_default("v9")


async def test_adapters_are_loaded_at_start_and_switched_at_run_time():
    engine = Engine()
    conductor = VllmConductor(*pool(vllm_config()), engine=engine, api=API)
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
    config = vllm_config(default_adapter=None, constraint="json_schema")
    conductor = VllmConductor(*pool(config), engine=engine, api=API)
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
    # vLLM 0.32 reads whitespace and backend from the engine's settings only.
    assert set(structured) == {"json"}
    args = conductor.engine_args()
    assert args["structured_outputs_config"] == {"backend": "guidance", "disable_any_whitespace": True}
    assert args["model"] == "/models/conductor-7b" and args["enforce_eager"] is True, "no compilation on CPU"

    grammar = VllmConductor(*pool(vllm_config(constraint="grammar")), engine=Engine(), api=API)
    await grammar.propose(ask("v1"))
    structured = grammar._engine.generated[-1]["params"].call.kwargs["structured_outputs"].call.kwargs
    assert "plan3 ::=" in structured["grammar"] and "json" not in structured
    assert grammar.engine_args()["structured_outputs_config"]["backend"] == "xgrammar"
    assert "{0,0}" not in structured["grammar"], "guidance refuses an empty repetition"


def test_without_a_model_the_converted_smollm2_is_served(monkeypatch, tmp_path):
    monkeypatch.setenv("BATON_MODEL_CACHE", str(tmp_path))
    data = default_config_data()
    data["conductor"] = {"backend": "vllm", "vllm": {}}
    conductor = VllmConductor(*pool(BatonConfig(**data)), engine=Engine(), api=SimpleNamespace(**{**vars(API), "on_cpu": False}))
    assert conductor.engine_args()["model"] == str(tmp_path / "smollm2-135m-instruct")
    assert conductor.base_version == "smollm2-135m-instruct"
    assert conductor.engine_args()["enforce_eager"] is False, "on a GPU, graphs are captured unless told otherwise"


async def test_a_published_version_is_served_a_refused_one_changes_nothing_and_rollback_works(tmp_path):
    engine = Engine(refuse={str(tmp_path / "v4")})
    conductor = VllmConductor(*pool(vllm_config()), engine=engine, api=API)
    await conductor.serve_policy(str(tmp_path / "v3"), "v3")
    assert conductor.default_adapter == "v3"
    assert (await conductor.propose(ask("baton"))).policy_version == "v3"
    assert (await conductor.propose(ask("baton@v2"))).policy_version == "v2", "a client may name policy@version"

    with pytest.raises(AdapterRejected, match="did not load the LoRA adapter v4"):
        await conductor.serve_policy(f"file://{tmp_path / 'v4'}", "v4")
    assert conductor.default_adapter == "v3" and "v4" not in conductor.adapters
    assert (await conductor.propose(ask("baton"))).policy_version == "v3"

    loads = len(engine.loaded)
    await conductor.serve_policy(str(tmp_path / "v3"), "v1")  # a rollback to a version loaded at start...
    await conductor.serve_policy(str(tmp_path / "v3"), "v3")  # ...and back: already loaded, not loaded again
    assert conductor.default_adapter == "v3" and len(engine.loaded) == loads + 1


async def test_without_vllm_starting_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail, as on a CPU machine
    conductor = build_backend(*pool(vllm_config()))
    with pytest.raises(ConductorUnavailable, match=r"needs the `vllm` package.*tools/vllm/setup.sh"):
        await conductor.propose(ask("baton"))
    assert not conductor.ready
    await conductor.aclose()


async def test_at_temperature_one_the_reported_log_probs_give_the_propensity():
    conductor = VllmConductor(*pool(vllm_config(temperature=1.0)), engine=Engine(), api=API)
    proposal = await conductor.propose(ask("v2"))
    assert proposal.log_propensity == pytest.approx(-0.25 - 1.0 - 0.5 + 0.0)
    assert proposal.propensity == pytest.approx(math.exp(-0.25 - 1.0 - 0.5 + 0.0))
    greedy = VllmConductor(*pool(vllm_config(temperature=0.0)), engine=Engine(), api=API)
    assert (await greedy.propose(ask("v2"))).log_propensity == 0.0
    unknown = await VllmConductor(*pool(vllm_config(temperature=0.9)), engine=Engine(), api=API).propose(ask("v2"))
    assert unknown.log_propensity is None


async def test_a_long_plan_keeps_its_propensity_in_log_space():
    # 900 tokens at log-prob -1: e^-900 is below the smallest double, so the probability is 0.0 and
    # only the log tells it from "unknown".
    engine = Engine()
    long_plan = SimpleNamespace(text=PLAN, token_ids=list(range(900)),
                                logprobs=[{i: SimpleNamespace(logprob=-1.0)} for i in range(900)], finish_reason="stop")

    async def generate(*args, **kwargs):
        yield SimpleNamespace(finished=True, outputs=[long_plan])

    engine.generate = generate
    config = vllm_config(temperature=1.0)
    result = await Planner(*pool(config), VllmConductor(*pool(config), engine=engine, api=API)).plan(ask("v1"))
    assert result.valid and result.plan.propensity == 0.0
    assert result.plan.HasField("log_propensity") and result.plan.log_propensity == pytest.approx(-900.0)
    unknown = await Planner(*pool(config), VllmConductor(*pool(vllm_config(temperature=0.5)), engine=Engine(), api=API)).plan(ask("v1"))
    assert not unknown.plan.HasField("log_propensity"), "unknown is an absent field, not a number"


async def test_the_engine_loads_in_a_thread_while_the_event_loop_keeps_running():
    building, release = threading.Event(), threading.Event()

    def build():  # stands in for vLLM's import and engine start: synchronous, and long
        building.set()
        assert release.wait(30)
        return Engine()

    conductor = VllmConductor(*pool(vllm_config()), api=API)
    conductor._build_engine = build
    starting = asyncio.create_task(conductor.start())
    # Awaiting here needs the event loop while build() blocks: heartbeats and /health/live would run too.
    assert await asyncio.to_thread(building.wait, 30)
    assert not conductor.ready and not starting.done()
    release.set()
    await starting
    assert conductor.ready
    await conductor.aclose()
