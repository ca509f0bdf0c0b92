"""The conductor's language: its prompt, the plan's schema and grammar, and the parser. Shared by the
router, which runs the conductor, and the trainer, which trains it."""

from baton_conductor.prompt import copies_example
from baton_conductor.prompter import Prompter
from baton_conductor.schema import (
           ADAPTER_MANIFEST,
           ConductorOutputError,
           PlanBounds,
           parse_plan,
           plan_grammar,
           plan_json_schema,
           render_plan,
)

__all__ = ["ADAPTER_MANIFEST", "ConductorOutputError", "PlanBounds", "Prompter", "copies_example", "parse_plan", "plan_grammar", "plan_json_schema",
           "render_plan"]
