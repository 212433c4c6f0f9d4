"""The core and the simulator stay free of torch: they run millions of steps and must import fast.

Everything under ``engine/core/`` is the pure part; this test imports every
module there (found by walking the folder, so a new module is covered too).
"""
import pkgutil
import subprocess
import sys
from pathlib import Path

import engine.core

CORE_MODULES = sorted(f"engine.core.{m.name}" for m in pkgutil.iter_modules([str(Path(engine.core.__file__).parent)]))


def test_core_and_simulator_do_not_import_torch():
    assert "engine.core.scheduler" in CORE_MODULES
    imports = ", ".join(["engine", *CORE_MODULES, "planner.sim", "planner.cli.app"])
    code = f"import sys; import {imports}; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
