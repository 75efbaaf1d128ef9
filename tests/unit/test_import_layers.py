"""The import layering of `localchat`, read from the source with `ast` (function-local imports count):
nothing below the HTTP layer imports `localchat.server`, the engine knows no backend, no backend imports
the layers above it, and modules import each other without cycles. Imports under `if TYPE_CHECKING:` never run, so they make no cycle,
but they still count for the layering rules."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "localchat"

# Who may import the HTTP layer: itself, the command line and the desktop shell that start it.
SERVER = "localchat.server"
SERVER_IMPORTERS = ("localchat.server", "localchat.cli", "localchat.desktop")
# The C library's one binding: below the backends, which both import it.
KERNELS = "localchat.kernels"
# The layers above the backends: the app layer, the HTTP server, the model lifecycle, chats, CLI, desktop.
APP_LAYERS = (
    "localchat.serving",
    "localchat.server",
    "localchat.models",
    "localchat.chats",
    "localchat.cli",
    "localchat.desktop",
)


@dataclass
class ImportGraph:
    modules: set[str] = field(default_factory=set)
    runtime: dict[str, set[str]] = field(default_factory=dict)  # imports that execute
    typing_only: dict[str, set[str]] = field(default_factory=dict)  # under `if TYPE_CHECKING:`
    function_local: int = 0  # imports of localchat modules inside a function body

    def all_imports(self, module: str) -> set[str]:
        return self.runtime[module] | self.typing_only[module]


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                skipped.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return skipped


def _function_nodes(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inside.update(id(sub) for sub in ast.walk(node) if sub is not node)
    return inside


def _targets(node: ast.Import | ast.ImportFrom, package: str, modules: set[str]) -> set[str]:
    """The localchat modules an import statement loads (`from a import b` is module a.b when it is one)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin for a in node.names]
    found = set()
    for name in names:
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        if name in modules:
            found.add(name)
    return found


def build_graph() -> ImportGraph:
    files = {_module_name(p): p for p in PACKAGE_ROOT.rglob("*.py")}
    graph = ImportGraph(modules={name for name, _ in files})
    for (module, is_package), path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_nodes, function_nodes = _type_checking_nodes(tree), _function_nodes(tree)
        package = module if is_package else module.rpartition(".")[0]
        runtime, typing_only = (
            graph.runtime.setdefault(module, set()),
            graph.typing_only.setdefault(module, set()),
        )
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            # Every module's first import runs `localchat/__init__` (its parent) anyway: `from localchat
            # import __version__` adds no edge, and the root's lazy `__getattr__` closes no cycle.
            targets = _targets(node, package, graph.modules) - {module, "localchat"}
            (typing_only if id(node) in typing_nodes else runtime).update(targets)
            if targets and id(node) in function_nodes and id(node) not in typing_nodes:
                graph.function_local += 1
    return graph


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative; only components of more than one module (the cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def cycle_edges(graph: ImportGraph) -> set[tuple[str, str]]:
    return {
        (a, b)
        for component in strongly_connected(graph.runtime)
        for a in component
        for b in graph.runtime[a]
        if b in component
    }


def test_nothing_below_the_http_layer_imports_the_server() -> None:
    graph = build_graph()
    found = {
        (module, target)
        for module in graph.modules
        if not any(module == owner or module.startswith(owner + ".") for owner in SERVER_IMPORTERS)
        for target in graph.all_imports(module)
        if target == SERVER or target.startswith(SERVER + ".")
    }
    offenders = sorted(f"{a} -> {b}" for a, b in found)
    assert offenders == [], "import localchat.serving (the application layer) instead:\n" + "\n".join(
        offenders
    )


def test_the_engine_imports_no_backend() -> None:
    graph = build_graph()
    offenders = sorted(
        f"{module} -> {target}"
        for module in graph.modules
        if module.startswith("localchat.engine")
        for target in graph.all_imports(module)
        if target.startswith("localchat.backends")
    )
    assert offenders == [], "the engine talks to a runner through engine.interface:\n" + "\n".join(offenders)


def test_backends_import_no_app_layer() -> None:
    """A backend runs what the layers above hand it (a bundle, runner options): it never imports them
    to build those itself (the torchrun worker gets its model loader and options from the CLI)."""
    graph = build_graph()
    offenders = sorted(
        f"{module} -> {target}"
        for module in graph.modules
        if module.startswith("localchat.backends")
        for target in graph.all_imports(module)
        if any(target == layer or target.startswith(layer + ".") for layer in APP_LAYERS)
    )
    assert offenders == [], "pass what the backend needs in from the caller:\n" + "\n".join(offenders)


def test_the_kernel_binding_sits_below_the_backends() -> None:
    """`localchat.kernels` (the C library's ctypes binding and block table) is shared by the torch
    backend, the MLX backend and the memory estimate: it imports no backend and no layer above them."""
    graph = build_graph()
    above = ("localchat.backends", "localchat.engine", *APP_LAYERS)
    offenders = sorted(
        f"{module} -> {target}"
        for module in graph.modules
        if module == KERNELS or module.startswith(KERNELS + ".")
        for target in graph.all_imports(module)
        if any(target == layer or target.startswith(layer + ".") for layer in above)
    )
    assert offenders == [], (
        "the kernel binding takes addresses and sizes, never backend objects:\n" + "\n".join(offenders)
    )
    users = {
        module for module in graph.modules for target in graph.runtime[module] if target.startswith(KERNELS)
    }
    assert any(u.startswith("localchat.backends.torch") for u in users)
    assert any(u.startswith("localchat.backends.mlx") for u in users)


def test_no_import_cycles() -> None:
    found = sorted(f"{a} -> {b}" for a, b in cycle_edges(build_graph()))
    assert found == [], (
        "these imports close a cycle between modules (move what both sides need into a module of its own):\n"
        + "\n".join(found)
    )


def test_the_checker_sees_a_cycle_and_a_function_local_import() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(edges) == [{"a", "b", "c"}]
    graph = build_graph()
    assert graph.function_local > 0  # the lazy imports of torch-free modules are parsed too


# Function-local imports of localchat modules left: each keeps a heavy or optional import (torch, mlx,
# transformers, litestar, Triton, ...) off the import path of a module that does not need it yet, or
# lets a test patch the name where it is defined. Lower this when you remove one; a new one needs that
# same reason.
MAX_FUNCTION_LOCAL_IMPORTS = 95


def test_function_local_imports_do_not_grow() -> None:
    assert build_graph().function_local <= MAX_FUNCTION_LOCAL_IMPORTS
