"""The import layers hold (pyproject.toml's import-linter contracts), and no module hides an import.

Layers: planner above workloads above engine above cuda_ext; the engine core is pure Python; planner's
folders from the CLI down to the catalogs. A project module is imported inside a function only to keep
torch out of a process that does not need it, and the line says so.
"""
import ast
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent
PROJECT = ("planner", "engine", "workloads", "cuda_ext")


def test_the_import_layers_hold():
    lint = shutil.which("lint-imports", path=str(Path(__import__("sys").executable).parent))
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]


def _imported(node: ast.AST) -> str:
    return node.module or "" if isinstance(node, ast.ImportFrom) else node.names[0].name


def test_a_project_module_is_imported_inside_a_function_only_to_keep_torch_out():
    hidden = []
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = path.read_text().splitlines()
            for function in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(function):
                    if (isinstance(node, (ast.Import, ast.ImportFrom)) and _imported(node).split(".")[0] in PROJECT
                            and "torch" not in lines[node.lineno - 1]):
                        hidden.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not hidden, "\n".join(hidden)
