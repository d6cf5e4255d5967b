"""The search: proposers (heuristic, LLM, replay, kernel), checks, evaluation, merge, loop."""
