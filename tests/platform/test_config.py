import pytest
from testbed import DEFAULT_CONFIG, default_config_data

from baton_platform.config import ConfigError, load_config


def test_the_shipped_default_config_is_valid_and_needs_no_key(monkeypatch):
    monkeypatch.delenv("BATON_CONFIG", raising=False)
    config = load_config(DEFAULT_CONFIG)
    assert config.providers == ["openai_compatible", "sim"]
    assert all(w.api_key_env is None for w in config.workers)
    sims = [w for w in config.workers if w.provider == "sim"]
    assert all(w.sim.dataset.is_file() for w in sims), "relative dataset paths resolve from the file"
    # One real model, started by the launcher, takes every question the sim matrices do not hold.
    (local,) = [w for w in config.workers if w.local_server is not None]
    assert local.provider == "openai_compatible" and local.base_url.startswith("http://127.0.0.1:")
    assert all(w.fallback == local.name for w in sims)
    assert "this machine" in local.card and "cannot answer" in local.card
    assert config.reward_logger.eval_sets["mmlu_pro"].path.is_file(), "so do the evaluation sets"


def test_every_shipped_card_states_strengths_weaknesses_and_its_price_class():
    import re

    for worker in load_config(DEFAULT_CONFIG).workers:
        form = re.fullmatch(r"Strengths: (.+)\. Weaknesses: (.+)\. Price: (free|low|medium|high)\.", worker.card)
        assert form, f"{worker.name}: {worker.card!r}"
        assert form.group(3) == worker.price.price_class, f"{worker.name} states the class its price has"


def test_a_local_server_is_only_for_an_openai_compatible_worker(write_config):
    data = default_config_data()
    data["workers"][0]["local_server"] = {"engine": "vllm"}
    with pytest.raises(ConfigError, match="local_server"):
        load_config(write_config(data=data))


def test_the_test_default_drops_the_local_model_unless_asked(write_config):
    without = load_config(write_config(data=default_config_data()))
    assert without.providers == ["sim"] and all(w.fallback is None for w in without.workers)
    served = load_config(write_config(data=default_config_data(local_model_port=5123)))
    (local,) = [w for w in served.workers if w.local_server is not None]
    assert local.base_url == "http://127.0.0.1:5123/v1"


def test_a_bad_field_fails_naming_the_field(write_config):
    data = default_config_data()
    data["workers"][1]["provider"] = "openia"
    with pytest.raises(ConfigError) as err:
        load_config(write_config(data=data))
    assert "workers.1.provider" in str(err.value)


def test_the_static_plan_may_only_name_configured_workers(write_config):
    path = write_config({"conductor": {"backend": "static", "plan": {
        "workers": ["nobody"], "subtasks": ["x"], "access": [[]]}}})
    with pytest.raises(ConfigError, match="unknown worker.*nobody"):
        load_config(path)


def test_plan_lists_must_have_equal_lengths(write_config):
    path = write_config({"conductor": {"backend": "static", "plan": {
        "workers": ["gemini-pro", "gemini-flash"], "subtasks": ["x"], "access": [[]]}}})
    with pytest.raises(ConfigError, match="conductor.plan.*equal lengths"):
        load_config(path)


def test_worker_names_are_unique(write_config):
    data = default_config_data()
    data["workers"][1]["name"] = data["workers"][0]["name"]
    with pytest.raises(ConfigError, match="used twice"):
        load_config(write_config(data=data))


def test_unknown_keys_are_rejected(write_config):
    with pytest.raises(ConfigError, match="gateway.prot"):
        load_config(write_config({"gateway": {"prot": 1}}))


def test_environment_overrides_the_file(write_config, monkeypatch):
    path = write_config()
    monkeypatch.setenv("BATON_GATEWAY__PORT", "9999")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "10.0.0.1:9092")
    config = load_config(path)
    assert config.gateway.port == 9999
    assert config.kafka.bootstrap_servers == "10.0.0.1:9092"


def test_baton_config_names_the_file(write_config, monkeypatch):
    monkeypatch.setenv("BATON_CONFIG", str(write_config({"gateway": {"port": 8123}})))
    assert load_config().gateway.port == 8123


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("workers: [unclosed", "not valid YAML"),
    ("- just\n- a list\n", "mapping at the top level"),
])
def test_unreadable_files_fail_clearly(tmp_path, content, message):
    path = tmp_path / "c.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_missing_baton_config_says_what_to_do(monkeypatch):
    monkeypatch.delenv("BATON_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="BATON_CONFIG is not set"):
        load_config()


def test_provider_specific_requirements(write_config):
    data = default_config_data()
    data["workers"].append({"name": "local", "provider": "openai_compatible", "model": "m"})
    with pytest.raises(ConfigError, match="base_url"):
        load_config(write_config(data=data))
    data["workers"][-1] = {"name": "s", "provider": "sim", "model": "m"}
    with pytest.raises(ConfigError, match="sim"):
        load_config(write_config(data=data))


def test_the_conductor_worker_name_is_reserved_and_only_recursion_may_use_it(write_config):
    data = default_config_data()
    data["workers"][1]["name"] = "conductor"
    with pytest.raises(ConfigError, match="'conductor' is reserved"):
        load_config(write_config(data=data))
    data = default_config_data()
    data["conductor"]["plan"] = {"workers": ["gemini-pro", "conductor"], "subtasks": ["a", "b"], "access": [[], "all"]}
    assert load_config(write_config(data=data)).conductor.max_depth == 1, "recursion is on by default"
    data["conductor"]["max_depth"] = 0
    with pytest.raises(ConfigError, match=r"conductor.plan: unknown worker\(s\) \['conductor'\]"):
        load_config(write_config(data=data))
    data = default_config_data()
    data["conductor"]["fallback_plan"] = {"workers": ["conductor"], "subtasks": ["a"], "access": [[]]}
    with pytest.raises(ConfigError, match="fallback_plan: unknown worker"):
        load_config(write_config(data=data))


def test_relative_model_paths_are_relative_to_the_file(write_config):
    data = default_config_data()
    data["conductor"]["transformers"] = {"model_path": "models/conductor", "cache_dir": "/abs/cache"}
    data["conductor"]["vllm"] = {"model": "Qwen/Qwen2.5-7B-Instruct", "adapters": {"v1": "adapters/v1"}}
    data["conductor"]["evidence"] = "conductor/evidence"
    path = write_config(data=data)
    conductor = load_config(path).conductor
    assert conductor.evidence == path.parent.resolve() / "conductor/evidence"
    assert conductor.transformers.model_path == path.parent.resolve() / "models/conductor"
    assert str(conductor.transformers.cache_dir) == "/abs/cache"
    assert conductor.vllm.adapters["v1"] == path.parent.resolve() / "adapters/v1"
    assert conductor.vllm.model == "Qwen/Qwen2.5-7B-Instruct", "a hub id is not a path"


def test_check_config_accepts_the_shipped_file_and_names_what_is_wrong(tmp_path, capsys):
    from baton_platform.config import check_main

    assert check_main(["--config", str(DEFAULT_CONFIG)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEFAULT_CONFIG.read_text() + "\nno_such_section: {}\n")
    assert check_main(["--config", str(bad)]) == 1
    assert "no_such_section" in capsys.readouterr().err
