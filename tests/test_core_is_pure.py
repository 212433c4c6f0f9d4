"""The core and the simulator stay free of torch: they run millions of steps and must import fast."""
import subprocess
import sys


def test_core_and_simulator_do_not_import_torch():
    code = ("import sys; import engine, engine.scheduler, engine.block_manager, engine.contiguous_allocator, "
            "engine.metrics, planner.simulator, planner.cli; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
