"""The OpenAI-compatible server over the engine (`planner serve` starts it)."""
