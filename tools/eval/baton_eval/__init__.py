"""Offline evaluation of the conductor: `baton eval table` (every way Baton can route, scored on held-out
rows), `python -m baton_eval.measure` (a model-backed conductor's plans on real questions) and
`python -m baton_eval.gpu_check` (`make gpu-check`: the 'vllm' conductor on a GPU).

Each plans with the router's own conductors, prompt, grammar and planner, offline, so this package
depends on the router (baton-router, declared in its pyproject) and not the other way round. It is a
package of its own so that the service images, which install only the services' members, ship serving
code alone. The trainer's replay and newworker stay in baton_trainer: its own commands run them, and a
service may not import a tool.
"""
