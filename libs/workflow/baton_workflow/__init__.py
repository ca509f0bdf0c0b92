from baton_workflow.context import policy_query, query_text, ready_steps, step_messages, turn
from baton_workflow.plan import CONDUCTOR, Access, Plan, from_proto, plan_problems, readable_steps, to_proto

__all__ = ["CONDUCTOR", "Access", "Plan", "from_proto", "plan_problems", "policy_query", "query_text", "readable_steps", "ready_steps",
           "step_messages", "to_proto", "turn"]
