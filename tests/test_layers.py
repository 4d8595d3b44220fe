"""The layers of the code base and who may import whom (docs/DESIGN.md, "Layers"): imports only point down.

Every ``import`` in the package counts, those inside functions and under ``TYPE_CHECKING`` too: a lazy import is
still a dependency. The package's front doors (``ios_ray/__init__.py``, ``ios_ray/__main__.py`` and the command's
entry point ``ios_ray/cli.py``) sit above everything and may reach the application. Inside the application its three
entrances are floors too: search, then compile (the backend may search), then cli (:mod:`ios_ray.app`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ios_ray"
SUBSYSTEMS = ("scheduler", "profiler", "store", "runtime", "app")
#: The application's entrances, each a package of ``app``, lowest first: each may import those before it only.
ENTRANCES = ("search", "compile", "cli")
FRONT_DOORS = ("ios_ray", "ios_ray.__main__", "ios_ray.cli")
THIRD_PARTY = ("ray", "duckdb", "pyarrow", "torch", "typer", "rich")

#: For each layer, the layers and libraries it must never import.
FORBIDDEN: dict[str, set[str]] = {
    "core": {*SUBSYSTEMS, "ray", "duckdb", "pyarrow", "typer", "rich"},
    "scheduler": {"profiler", "store", "runtime", "app", "ray", "duckdb", "pyarrow", "torch", "typer", "rich"},
    "store": {"scheduler", "profiler", "runtime", "app", "ray", "torch", "typer", "rich"},
    "runtime": {"scheduler", "profiler", "store", "app", "ray", "duckdb", "pyarrow", "typer", "rich", "zoo"},
    "profiler": {"scheduler", "store", "app", "typer", "rich"},
    "app": set(),
    **{f"app.{entrance}": {f"app.{above}" for above in ENTRANCES[i + 1:]} for i, entrance in enumerate(ENTRANCES)},
}


def module_name(path: Path) -> str:
    """The dotted module name of a file of the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """The layer a module of the package belongs to: a subsystem's name, or ``core``."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "app" and parts[2] in ENTRANCES:
        return f"app.{parts[2]}"
    return parts[1] if len(parts) > 1 and parts[1] in SUBSYSTEMS else "core"


def targets(imported: str) -> set[str]:
    """What an imported name counts as: its layer (or ``zoo``) inside the package, its top name outside."""
    parts = imported.split(".")
    if parts[0] != "ios_ray":
        return {parts[0]} if parts[0] in THIRD_PARTY else set()
    found = {layer_of(imported)}
    if len(parts) > 1 and parts[1] == "app":
        found.add("app")
    if len(parts) > 1 and parts[1] in ("zoo", "models"):
        found.add("zoo")
    return found


def imports_of(source: str, module: str) -> list[str]:
    """Every module a source file imports; the package uses absolute imports only, so a relative one is an error."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module}: use an absolute import, not a relative one"
            found.append(node.module or "")
            found += [f"{node.module}.{alias.name}" for alias in node.names if node.module == "ios_ray"]
    return found


def violations(source: str, module: str) -> list[str]:
    """The forbidden imports of one module, as ``module -> imported (layer)`` lines."""
    if module in FRONT_DOORS:
        return []
    layer = layer_of(module)
    bad = []
    for imported in imports_of(source, module):
        hit = targets(imported) & FORBIDDEN[layer]
        if hit and not (layer == "core" and module.startswith("ios_ray.zoo")):
            bad.append(f"{module} -> {imported} ({', '.join(sorted(hit))})")
    return bad


def test_imports_only_point_down() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 40
    found = [v for path in files for v in violations(path.read_text(), module_name(path))]
    assert found == []


@pytest.mark.parametrize(
    "module, source",
    [
        ("ios_ray.ir", "from ios_ray.app.search.job import run_search"),
        ("ios_ray.frontend", "def f():\n    import ray\n"),
        ("ios_ray.scheduler.dp", "from ios_ray.store import LatencyStore"),
        ("ios_ray.scheduler.plan", "import torch"),
        ("ios_ray.runtime.executor", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import duckdb\n"),
        ("ios_ray.runtime.scheduled_module", "from ios_ray.zoo import ZOO"),
        ("ios_ray.store.latency_store", "from ios_ray.profiler import DevicePool"),
        ("ios_ray.profiler.real", "from ios_ray.scheduler import optimize_graph"),
        ("ios_ray.app.search.job", "from ios_ray.app.compile.backend import backend"),
        ("ios_ray.app.search.options", "def f():\n    from ios_ray.app.cli.util import parse_list\n"),
        ("ios_ray.app.compile.compiled_graph", "from ios_ray.app.cli.bench import relative_error"),
    ],
)
def test_a_forbidden_import_is_caught(module: str, source: str) -> None:
    assert violations(source, module) != []


def test_allowed_imports_pass() -> None:
    assert violations("from ios_ray.runtime import Program\nimport ray", "ios_ray.profiler.real") == []
    assert violations("from ios_ray.scheduler import plan_graph\nimport duckdb", "ios_ray.app.search.job") == []
    assert violations("from ios_ray.app.cli import app", "ios_ray.__main__") == []
    assert violations("from ios_ray.app.search.api import search", "ios_ray.app.compile.compiled_graph") == []
    assert violations("from ios_ray.app.compile import backend", "ios_ray.app.cli.commands") == []
