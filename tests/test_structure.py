"""The import graph: the core imports no app, and no module imports itself round a loop.

Read from the source (every `import`, at any depth, TYPE_CHECKING blocks included), so a
cycle cannot hide behind a function-level import either.
"""

import ast
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parent.parent
PACKAGES = ("relay", "presence", "chat", "agents", "overview", "web", "devtools", "bench")
APPS = ("presence", "chat", "agents", "overview", "web", "devtools", "bench")
# The Python client is a package of its own, under its own source root.
CLIENT_ROOT = BASE_DIR / "clients" / "python" / "src"
# Where the project is assembled: these name the apps by design.
ASSEMBLY = {"relay.settings", "relay.urls", "relay.asgi"}


def _module_name(path: Path) -> str:
    root = CLIENT_ROOT if path.is_relative_to(CLIENT_ROOT) else BASE_DIR
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports (a `from package import name` counts the submodule when it is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """Every project module and the project modules it imports."""
    roots = [BASE_DIR / package for package in PACKAGES] + [CLIENT_ROOT / "relay_client"]
    paths = [path for root in roots for path in root.rglob("*.py")]
    modules = {_module_name(path) for path in paths}
    graph = {_module_name(path): _imports(path, modules) for path in paths}
    # A package's __init__ is imported on the way to each submodule: that is no arrow of its own.
    return {
        module: {target for target in targets if not module.startswith(f"{target}.")}
        for module, targets in graph.items()
    }


def test_the_core_imports_no_app():
    graph = import_graph()
    reaching_out = {
        module: sorted(target for target in targets if target.split(".")[0] in APPS)
        for module, targets in graph.items()
        if module.split(".")[0] == "relay" and module not in ASSEMBLY
    }
    assert {module: targets for module, targets in reaching_out.items() if targets} == {}
    # The walk does see imports across packages: the apps import the core.
    assert {"relay.registry", "relay.layer"} <= graph["chat.handlers"]
    # ... and the client's modules, under their own root.
    assert "relay_client.exceptions" in graph["relay_client.events"]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules round it, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        state[module] = 2
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_module_imports_itself_round_a_loop():
    assert _cycle(import_graph()) is None


@pytest.mark.parametrize(
    "graph, cycle",
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ],
)
def test_the_cycle_search_finds_a_loop_and_only_a_loop(graph, cycle):
    assert _cycle(graph) == cycle


def _limits_imports(path: Path) -> set[str]:
    """What `path` imports from the `limits` library, as `module.name`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "limits":
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "limits"}
    return found


def test_every_rate_is_counted_by_relay_rate_limits_alone():
    """One mechanism: any module may name a rate (a `RateLimitItem`), but only relay/rate_limits.py
    counts (a storage, a strategy) and answers the excess; the apps take its ConnectionLimit."""
    paths = [path for package in PACKAGES for path in (BASE_DIR / package).rglob("*.py")]
    imports = {_module_name(path): _limits_imports(path) for path in paths}
    counting = {
        module
        for module, names in imports.items()
        if any(not name.startswith("limits.RateLimitItem") for name in names)
    }
    assert counting == {"relay.rate_limits"}
    # The walk does see the apps' rates.
    assert "limits.RateLimitItemPerSecond" in imports["chat.signals"]
