"""The chat-template time limit (engine/entrypoints/openai/frontend.py run_with_deadline) holds whatever the
template's Python does meanwhile: collections that run weakref callbacks, and broad exception handlers."""
import time
import weakref

import jinja2.sandbox
import pytest

from engine.entrypoints.openai.frontend import RenderTimeout, run_with_deadline

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial

LIMIT = 0.2


def render_within_limit(template: str, **context) -> float:
    compiled = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(template)
    start = time.monotonic()
    with pytest.raises(RenderTimeout):
        run_with_deadline(lambda: compiled.render(**context), LIMIT)
    return time.monotonic() - start


class Item:
    pass


def test_a_runaway_template_stops_at_the_limit():
    assert render_within_limit("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}") < 2


def test_weakref_callbacks_run_meanwhile_do_not_switch_the_limit_off():
    # Each call drops an object with a weakref callback, and nearly all the Python code that runs is that
    # callback (a WeakValueDictionary's removal callback, in the server's case). A timeout raised inside a
    # callback used to be printed and dropped, and the trace function switched off: the template then ran on
    # to its end (several seconds here, 10^10 loops in the server's test) instead of stopping at the limit.
    refs = []

    def on_drop(_ref):
        for _ in range(200):
            pass

    def churn(i):
        item = Item()
        refs.append(weakref.ref(item, on_drop))
        del item                # its callback runs here
        return i

    elapsed = render_within_limit("{% for b in range(20000) %}{{ churn(b) and '' }}{% endfor %}", churn=churn)
    assert elapsed < 2


def test_a_broad_exception_handler_in_the_way_cannot_swallow_the_timeout():
    def careless(render):
        try:
            return render()
        except Exception:       # what a template library might do with a template's error
            return "recovered"

    compiled = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}")
    start = time.monotonic()
    with pytest.raises(RenderTimeout):
        run_with_deadline(lambda: careless(compiled.render), LIMIT)
    assert time.monotonic() - start < 2


def test_a_template_within_the_limit_renders():
    compiled = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string("{% for m in items %}{{ m }}{% endfor %}")
    assert run_with_deadline(lambda: compiled.render(items=[1, 2]), LIMIT) == "12"
