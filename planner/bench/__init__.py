"""The load client: a trace replayed against any OpenAI-compatible server, timed as vLLM's benchmark does."""
