"""The one error a checkpoint the engine cannot run raises.

A ValueError (as vLLM raises for unsupported architectures), so every caller
that reports bad input already turns it into a one-line message.
"""


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture, activation or rotary variant is not implemented."""
