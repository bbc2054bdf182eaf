"""The core does not depend on its edges: what ``logstore/`` imports, and what importing the
broker and the CLI loads."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from logstore.demo import DEMO_STEPS_GROUP, DemoStep

REPO_ROOT = Path(__file__).resolve().parents[2]
CORE = REPO_ROOT / "logstore"
EDGES = frozenset({"jobs", "datasource", "pyspark", "pyspark_logstore"})
OBJECT_STORE_SDKS = frozenset({"fsspec", "s3fs", "boto3", "botocore", "aiobotocore"})
IMPORT_FUNCTIONS = frozenset({"import_module", "__import__"})


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for each absolute import in ``path``, including ``import_module("x")``
    and ``__import__("x")`` with a literal name, so a string cannot hide an import."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and _function_name(node) in IMPORT_FUNCTIONS:
            yield node.lineno, node.args[0].value


def _function_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def imports_of(packages: frozenset[str], files: list[Path]) -> list[str]:
    return [f"{path.relative_to(REPO_ROOT)}:{line} imports {module}"
            for path in files for line, module in imported_modules(path)
            if module.split(".")[0] in packages]


def test_core_imports_no_edge() -> None:
    """Goal: nothing under logstore/ imports jobs/, datasource/ or pyspark (DESIGN.md: the
    core never imports an edge). Method: every import statement of every logstore/**.py,
    parsed with ast; the scan also sees the CLI and the demo."""
    files = sorted(CORE.rglob("*.py"))
    assert CORE / "cli" / "__init__.py" in files and CORE / "demo.py" in files
    assert imports_of(EDGES, files) == []


def test_only_tiering_imports_object_store_sdks() -> None:
    """Goal: fsspec and s3fs (the ``tiering`` extra) are reached only from logstore/tiering/,
    so a broker installed without the extra runs. Method: the same ast scan over the rest."""
    files = [p for p in sorted(CORE.rglob("*.py")) if CORE / "tiering" not in p.parents]
    assert imports_of(OBJECT_STORE_SDKS, files) == []


def test_importing_the_broker_the_clients_and_the_cli_loads_no_edge() -> None:
    """Goal: ``import logstore.main, logstore.cli`` (what ``logstore broker start`` loads)
    and the clients bring in neither pyspark nor jobs/ nor datasource/. Method: a fresh
    interpreter imports them, builds the command's parser, and lists what is loaded."""
    script = ("import sys, logstore, logstore.main, logstore.cli, logstore.demo\n"
              "logstore.cli.build_parser()\n"
              "logstore.Admin, logstore.Consumer, logstore.Producer, logstore.NewTopic\n"
              f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(EDGES)!r}))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_demo_spark_step_is_the_entry_point_pyproject_declares() -> None:
    """Goal: ``logstore demo`` finds the Spark step once the package is installed. Method: the
    entry point pyproject.toml declares in the group ``load_step`` reads resolves to a class
    with ``DemoStep``'s attributes (loaded as the installed entry point would load it)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    target = project["entry-points"][DEMO_STEPS_GROUP]["spark"]
    module, _, name = target.partition(":")
    step = getattr(importlib.import_module(module), name)
    assert step.reads_as == "read by Spark"
    assert callable(step.run)
    assert {"reads_as", "run"} <= set(DemoStep.__annotations__) | set(vars(DemoStep))
