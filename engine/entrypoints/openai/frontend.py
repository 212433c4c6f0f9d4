"""The server's own tokenizer work, off the event loop and bounded: prompts and chat templates.

Encoding and chat-template rendering run in one worker thread (the event loop
keeps answering /health meanwhile; one thread, because a fast tokenizer is not
safe to share between threads). Before any of it, a prompt whose UTF-8 length
proves it has more tokens than the context holds is refused: no token of the
vocabulary decodes to more bytes than the longest vocabulary entry, so a text
over ``max_model_len`` times that many bytes (twice, for normalizers that drop
characters) cannot fit. Rendering a chat template has a time limit, enforced
by a trace function that stops the template's Python code when it runs over.
"""
from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from engine.entrypoints.openai.errors import RequestError

DEFAULT_TOKEN_BYTES = 64      # when the tokenizer does not list its vocabulary
TRACE_CHECK_EVERY = 256       # trace events between two looks at the clock


class RenderTimeout(BaseException):
    """The chat template ran past its time limit. A BaseException, as KeyboardInterrupt is, so that no
    ``except Exception`` on the way out of the template can take it for a template error and go on."""


def longest_token_bytes(tokenizer) -> int:
    """The most UTF-8 bytes one token of the vocabulary (added tokens included) decodes to, at most."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError, TypeError):
        return DEFAULT_TOKEN_BYTES
    added = [str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values()]
    return max((len(t.encode("utf-8", "replace")) for t in [*vocab, *added]), default=DEFAULT_TOKEN_BYTES) or 1


# apply_chat_template's own arguments: a request's chat_template_kwargs may not set them behind its fields' back
RENDER_ARGUMENTS = {"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
                    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"}
TEMPLATE_CODE = "<template>"    # the file name jinja2 gives a compiled template's code


def run_with_deadline(fn, seconds: float, stops_in=lambda code: code.co_filename == TEMPLATE_CODE):
    """``fn()``, stopped with RenderTimeout once it has run ``seconds`` (Python code only).

    The trace function raises only in the frames of code ``stops_in`` accepts (a compiled jinja2 template's,
    where a template that runs too long spends its time). Anywhere else it could land in a weakref callback
    or a finalizer that a garbage collection runs in the middle of the template: Python prints and drops an
    exception raised there, and a trace function that raised is switched off, so the template would then
    run on without a limit."""
    deadline = time.monotonic() + seconds
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if not stops_in(frame.f_code):
            return None          # no line events here; calls made from here still come through
        count += 1
        if count % TRACE_CHECK_EVERY == 0 and time.monotonic() > deadline:
            raise RenderTimeout
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return fn()
    finally:
        sys.settrace(previous)


class Frontend:
    """Tokenizes prompts and renders chat templates for the HTTP handlers."""

    def __init__(self, tokenizer, max_model_len: int, *, render_timeout: float = 2.0,
                 trust_request_chat_template: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.render_timeout = render_timeout
        self.trust_request_chat_template = trust_request_chat_template
        self.max_prompt_bytes = 2 * max_model_len * (longest_token_bytes(tokenizer) if tokenizer else 1)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="frontend")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def check_length(self, text: str, param: str) -> None:
        """Refuse, without tokenizing it, a text that surely has more tokens than the context holds."""
        size = len(text.encode("utf-8", "surrogatepass"))    # (a lone surrogate is the tokenizer's to refuse)
        if size > self.max_prompt_bytes:
            raise RequestError(f"This model's maximum context length is {self.max_model_len} tokens. However, "
                               f"your {param} has {size} bytes, more than {self.max_model_len} tokens can hold.",
                               param=param)

    async def encode(self, text: str, *, param: str = "prompt", add_special_tokens: bool = True) -> list[int]:
        """A prompt's ids: one the context can hold, and not empty."""
        self.check_length(text, param)
        ids = await self.tokenize(text, param=param, add_special_tokens=add_special_tokens)
        if not ids:                # (e.g. a request's chat template that renders nothing)
            raise RequestError(f"the {param} is empty once tokenized: there is nothing to complete", param=param)
        return ids

    async def tokenize(self, text: str, *, param: str = "prompt", add_special_tokens: bool = True) -> list[int]:
        """All of a text's ids, however many (vLLM's /tokenize counts a text of any length)."""
        self._check_tokenizer(param)
        try:
            # (verbose=False: a prompt past the tokenizer's model_max_length is the context check's to refuse, not
            # a warning in the server's log)
            return await self._run(lambda: self.tokenizer(text, add_special_tokens=add_special_tokens,
                                                          verbose=False)["input_ids"])
        except Exception as exc:   # text the tokenizer cannot take: the request's fault, said in one line
            raise RequestError(f"the tokenizer cannot encode this {param}: {type(exc).__name__}: {exc}",
                               param=param) from None

    async def decode(self, ids: list[int]) -> str:
        self._check_tokenizer("tokens")
        return await self._run(lambda: self.tokenizer.decode(ids))

    async def token_strs(self, ids: list[int]) -> list[str]:
        """Each id's token as the vocabulary writes it (vLLM's return_token_strs)."""
        return await self._run(lambda: self.tokenizer.convert_ids_to_tokens(ids))

    def _check_tokenizer(self, param: str) -> None:
        if self.tokenizer is None:
            raise RequestError("this model has no tokenizer: send the prompt as a list of token ids", param=param)

    async def render_chat(self, messages: list[dict], request_template: str | None, add_generation_prompt: bool,
                          continue_final_message: bool = False, template_kwargs: dict | None = None) -> str:
        """The chat prompt, rendered by the model's template (or the request's, when the server trusts it);
        `continue_final_message` leaves the last message open, `template_kwargs` are the template's variables
        (vLLM's chat_template_kwargs: `enable_thinking`, say)."""
        tok = self.tokenizer
        if continue_final_message and add_generation_prompt:      # vLLM's words
            raise RequestError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                               param="continue_final_message")
        taken = sorted(set(template_kwargs or {}) & RENDER_ARGUMENTS)
        if taken:
            raise RequestError(f"chat_template_kwargs: {taken[0]!r} is set by the request's own fields, not a "
                               f"template variable", param="chat_template_kwargs")
        if request_template is not None and not self.trust_request_chat_template:
            # vLLM's rule: a request's own template runs only with --trust-request-chat-template.
            raise RequestError("chat_template in a request is refused: start the server with "
                               "--trust-request-chat-template to allow it", param="chat_template")
        template = request_template or (getattr(tok, "chat_template", None) if tok is not None else None)
        if tok is None or not template:
            raise RequestError("this model has no chat template (none in its folder's tokenizer_config.json): "
                               "use /v1/completions", param="messages")
        self.check_length("".join(m["content"] for m in messages), "messages")

        def render() -> str:
            return run_with_deadline(lambda: tok.apply_chat_template(
                messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **(template_kwargs or {})), self.render_timeout)
        try:
            return await self._run(render)
        except RenderTimeout:
            raise RequestError(f"the chat template took more than {self.render_timeout:g} s to render these "
                               f"messages", param="chat_template" if request_template else "messages") from None
        except RequestError:
            raise
        except Exception as exc:   # a template that does not render these messages (raise_exception, a type error)
            raise RequestError(f"the chat template failed on these messages: {exc}", param="messages") from None

    async def _run(self, fn):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
