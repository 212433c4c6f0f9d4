"""A deployment resolved against the catalogs: its memory plan, the limits vLLM derives, what vLLM refuses."""
