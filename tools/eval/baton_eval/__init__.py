"""Offline evaluation of Baton's routing.

- `baton eval replay` (`replay`, with `newworker` for a worker held out of training): the fast
  policy trained on one outcome matrix and replayed on another.
- `baton eval heldout` (`heldout`): its gain, or the router's estimate's, on whole held-out subjects,
  over seeds.
- `baton eval table` (`conductor_table`): every way Baton can route, scored on the same held-out rows.
- `python -m baton_eval.measure`: a model-backed conductor's plans on real questions.
- `python -m baton_eval.gpu_check` (`make gpu-check`): the 'vllm' conductor on a GPU.

The LLM conductors plan with the router's own conductors, prompt, grammar and planner, so this package
depends on the router and the trainer (declared in its pyproject), never the other way round. It is a
package of its own so that the service images, which install only the services' members, ship serving
and training code alone.
"""
