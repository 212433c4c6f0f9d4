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
python -m pytest -q -m "not slow and not gpu" "$@"
