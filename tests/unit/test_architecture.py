"""The house rules, checked on the code's own imports (every import: module level, inside
functions, under TYPE_CHECKING, and the lazy export tables of the package faces).

Floors, from the ground up (a module imports only its own floor or below)::

    kernel       errors validation bridge device models batching _tokens _version _corpus _lazy _int8 _loaded _bf16
                 _memory
    values       the plain data types of the components (index._types, llm._types, ...) and the filter language
    contracts    protocols (what a surface may call), wire (the HTTP contract), _http (the one HTTP client)
    components   embed/ rerank/ index/ llm/ context/ answer_cache: each imports no other component
    composition  runtime (connect), remote/, rag/
    surfaces     server/ (and, outside the core, the adapters: public modules only)
    apps         apps/ (cli, demo, bench, bulk, ray): nothing below imports them
    face         gpuprompt/__init__ (and __main__): nothing imports it
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "gpuprompt": ROOT / "shared" / "gpuprompt",
    "langchain_gpuprompt": ROOT / "langchain_gpuprompt",
    "llamaindex_gpuprompt": ROOT / "llamaindex_gpuprompt",
}
MAX_LINES = 650

KERNEL = {"errors", "validation", "bridge", "device", "models", "batching", "_tokens", "_version", "_corpus", "_lazy",
          "_int8", "_loaded", "_bf16", "_memory"}
VALUES = {"index._types", "index.filters", "llm._types", "llm._tools", "context._types", "rerank._types",
          "index._lexical_text"}
CONTRACTS = {"protocols", "wire", "_http"}
COMPONENTS = {"embed", "rerank", "index", "llm", "context", "answer_cache"}
COMPOSITION = {"runtime", "remote", "rag"}
FLOORS = ["kernel", "values", "contracts", "components", "composition", "surfaces", "apps", "face"]


def _modules() -> dict[str, Path]:
    out = {}
    for package, base in PACKAGES.items():
        for path in base.rglob("*.py"):
            parts = [package, *path.relative_to(base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module file ``name`` is in (``a.b.C`` -> ``a.b``); None for a name outside the packages
    (a top-level package counts only when named itself: ``gpuprompt.nothing`` resolves to nothing)."""
    original = name
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    if name in PACKAGES and original != name and original.split(".")[1] not in _top_level_names(name):
        return None
    return name or None


def _top_level_names(package: str) -> set[str]:
    """Names a module (a package's ``__init__``) defines or exports (``from gpuprompt import connect``),
    its lazy export tables included."""
    tree = ast.parse(MODULES[package].read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            names.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(r for a in node.names if (r := _resolve(a.name)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = here
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                full = f"{base}.{alias.name}"
                target = full if full in MODULES else _resolve(base)
                if target:
                    found.add(target)
        elif isinstance(node, ast.Dict):  # a lazy export table: name -> module
            for value in node.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value in MODULES:
                    found.add(value.value)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                if (target := _resolve(node.args[0].value)):
                    found.add(target)
    found.discard(module)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _floor(module: str) -> str | None:
    """The floor of a core module (None for the adapters)."""
    if not module.startswith("gpuprompt"):
        return None
    if module in ("gpuprompt", "gpuprompt.__main__"):
        return "face"
    inner = module[len("gpuprompt."):]
    top = inner.split(".", 1)[0]
    if inner in KERNEL:
        return "kernel"
    if inner in VALUES:
        return "values"
    if inner in CONTRACTS:
        return "contracts"
    if top in COMPONENTS:
        return "components"
    if top in COMPOSITION:
        return "composition"
    if top == "server":
        return "surfaces"
    if top == "apps":
        return "apps"
    raise AssertionError(f"{module} has no floor: add it to the table of tests/unit/test_architecture.py")


def _cycles() -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_is_read() -> None:
    assert len(MODULES) > 100
    assert "gpuprompt.embed" in GRAPH["gpuprompt.runtime"]  # a function-level import
    assert "gpuprompt.runtime" in GRAPH["gpuprompt"]  # the face's export table


def test_no_import_cycle() -> None:
    assert _cycles() == []


def test_every_core_module_has_a_floor_and_imports_only_its_floor_or_below() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        floor = _floor(module)
        if floor is None:
            continue
        for target in targets:
            other = _floor(target)
            if other is None:  # an adapter: only the apps (the benchmarks, the demo) stand above them
                if floor != "apps":
                    wrong.append(f"{module} imports the adapter {target}")
            elif FLOORS.index(other) > FLOORS.index(floor):
                wrong.append(f"{module} ({floor}) imports {target} ({other})")
    assert wrong == []


def test_components_import_no_other_component() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        if _floor(module) != "components":
            continue
        mine = module.split(".")[1]
        for target in targets:
            if _floor(target) == "components" and target.split(".")[1] != mine:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_nothing_imports_the_package_face() -> None:
    assert [m for m, targets in GRAPH.items() if "gpuprompt" in targets and m != "gpuprompt.__main__"] == []


@pytest.mark.parametrize("adapter", ["langchain_gpuprompt", "llamaindex_gpuprompt"])
def test_adapters_import_only_public_core_modules(adapter: str) -> None:
    private = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items() if module.startswith(adapter)
        for target in targets
        if target.startswith("gpuprompt") and any(part.startswith("_") for part in target.split(".")[1:])
    )
    assert private == []


def test_the_server_imports_nothing_of_remote_mode() -> None:
    assert sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith("gpuprompt.server")
                  for t in ts if t.startswith("gpuprompt.remote")) == []


def test_every_first_party_from_import_names_something_that_exists() -> None:
    """``from gpuprompt.x import name`` anywhere (inside functions too, where nothing runs it until a
    request does) names a name ``gpuprompt.x`` defines or exports, or a submodule of it."""
    missing = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module not in MODULES:
                continue
            defined = _top_level_names(node.module)
            missing.extend(f"{module}:{node.lineno} imports {alias.name} from {node.module}, which has none"
                           for alias in node.names
                           if alias.name != "*" and alias.name not in defined
                           and f"{node.module}.{alias.name}" not in MODULES)
    assert missing == []


def test_no_source_file_is_over_650_lines() -> None:
    long = {str(path.relative_to(ROOT)): n for path in MODULES.values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
