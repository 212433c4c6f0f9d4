#!/usr/bin/env bash
# The README's test command: set up, then run the default (fast) suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The HTML-report test renders report.html in headless Chromium from Debian's packages.
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing chromium (apt-get) for the report.html rendering test ..." >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >&2 \
            || echo "could not install chromium: the rendering test will skip" >&2
    else
        echo "chromium missing and not root: the report.html rendering test will skip" >&2
    fi
fi
. .venv/bin/activate
# A selection of the caller's own (-m slow, -m gpu, ...): one pass, as given.
for arg in "$@"; do
    case "$arg" in -m*) exec python -m pytest -q "$@" ;; esac
done
# The default suite in two passes: the tests that read the wall clock (marked `serial`: a live engine
# timed against the simulator, a server's time limits) alone, as on an idle machine; then the rest on
# every core (pytest-xdist; at most 8 workers), one torch thread per worker so that the workers do not
# oversubscribe them.
# A pass that selects nothing (a test path or -k of the other kind) exits 5: not a failure, unless both do.
alone=0; python -m pytest -q -m "serial and not slow and not gpu" "$@" || alone=$?
workers=$(( $(nproc) < 8 ? $(nproc) : 8 ))       # each worker holds torch and a model or two: ~1.5 GB
rest=0; OMP_NUM_THREADS=1 python -m pytest -q -m "not serial and not slow and not gpu" -n "$workers" "$@" || rest=$?
passed() { [ "$1" = 0 ] || [ "$1" = 5 ]; }
passed "$alone" && passed "$rest" && [ "$alone$rest" != 55 ]
