"""The layout's rules, checked on the source: ARCHITECTURE.md states them for people.

- no import cycle among the modules of `framework` and `framework_plugins`, counting
  imports inside functions (only `TYPE_CHECKING` blocks are left out: they never run);
- a private (underscore) module or name is imported only from inside its own package;
- no function longer than 80 lines;
- in the download package the one deferred import is the one that keeps torch out of
  plain calls.

The layer order itself (cli, then data and download, then config, registry, errors) is
import-linter's contract in pyproject.toml, run by scripts/test.sh.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"framework": ROOT / "framework", "framework_plugins": ROOT / "plugins"}
MAX_FUNCTION_LINES = 80
# manager imports the cluster fetch inside `cached_path(..., cluster=True)`: the cluster
# fetch needs torch.distributed, and a plain call must not import torch.
DEFERRED_IN_DOWNLOAD = {("framework.download.manager", "framework.download._cluster")}
# The layers, top to bottom, as pyproject.toml's import-linter contract lists them;
# `framework` itself (the composition root) sits above them all.
LAYERS = [
    ("framework.cli",),
    ("framework.data", "framework.download"),
    ("framework.distributed",),
    ("framework.config",),
    ("framework.registry", "framework.hookspecs"),
    ("framework.errors",),
]


def _modules() -> dict[str, Path]:
    found = {}
    for top, base in PACKAGES.items():
        for path in sorted(base.rglob("*.py")):
            parts = [top, *path.relative_to(base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _runtime_nodes(tree: ast.Module) -> Iterator[tuple[ast.AST, bool]]:
    """Every node outside `if TYPE_CHECKING:` blocks, with whether it sits in a function."""

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.AST, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (pair for sub in child.orelse for pair in walk_one(sub, in_function))
                continue
            yield from walk_one(child, in_function)

    def walk_one(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.AST, bool]]:
        yield node, in_function
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from walk(node, inner)

    yield from walk(tree, False)


def _constants(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    """Module-level `NAME = "text"` and `NAME = ("text", ...)` assignments."""
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            continue
        texts = (value,) if isinstance(value, str) else value
        if isinstance(texts, (tuple, list)) and all(isinstance(text, str) for text in texts):
            found.update({t.id: tuple(texts) for t in node.targets if isinstance(t, ast.Name)})
    return found


def _late_imports(node: ast.AST, constants: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The modules of ours an `importlib.import_module(...)` call may import: a literal
    name, a module-level constant, or any name in module-level constants when the
    argument is a loop variable (a conservative guess that never misses one)."""
    if not (isinstance(node, ast.Call) and node.args):
        return ()
    func = node.func
    if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) != "import_module":
        return ()
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        names: tuple[str, ...] = (arg.value,)
    elif isinstance(arg, ast.Name) and arg.id in constants:
        names = constants[arg.id]
    else:
        names = tuple(name for texts in constants.values() for name in texts)
    return tuple(name for name in names if name.split(".")[0] in PACKAGES and _owner(name))


def _imports(module: str) -> Iterator[tuple[str, bool, int]]:
    """(dotted name imported, inside a function, line) for each name `module` imports,
    also by `importlib.import_module` with a literal name."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    constants = _constants(tree)
    for node, in_function in _runtime_nodes(tree):
        for late in _late_imports(node, constants):
            yield late, in_function, node.lineno
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, in_function, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if _is_package(module) else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                yield f"{base}.{alias.name}", in_function, node.lineno


def _owner(dotted: str) -> str | None:
    """The module of ours that `dotted` (a module, or a name in one) lives in."""
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def _graph() -> dict[str, set[str]]:
    """Each module's imports of other framework modules: every import, in a function or
    not, `importlib.import_module("...")` included."""
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for module in MODULES:
        for dotted, _, _ in _imports(module):
            target = _owner(dotted)
            if target and target != module:
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def _layer(module: str) -> int:
    """The index of `module`'s layer in LAYERS. Above them: the first-party plugins, then
    the root package and `python -m framework`. `framework.testing` sits beside the
    engines; the root's own helper modules (`framework._lazy`, ...) below every layer."""
    if module.startswith("framework_plugins"):
        return -2
    if module in ("framework", "framework.__main__"):
        return -1
    if module == "framework.testing":
        return 1
    for index, packages in enumerate(LAYERS):
        if any(module == package or module.startswith(package + ".") for package in packages):
            return index
    assert module.startswith("framework._"), f"{module} is in no layer: add it to LAYERS"
    return len(LAYERS)


def test_no_layer_imports_a_layer_above_it_even_at_run_time() -> None:
    """What import-linter checks, also for imports inside functions and importlib's."""
    upward = [
        (module, target)
        for module, targets in _graph().items()
        for target in targets
        if _layer(target) < _layer(module)
    ]
    assert upward == []


def _package_of(module: str) -> str:
    return module if _is_package(module) else module.rpartition(".")[0]


def _private_owner(dotted: str) -> str | None:
    """The package a private dotted name belongs to: the part before its first `_name`."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            owner = ".".join(parts[:i])
            # a private name inside a module belongs to that module's package
            return _package_of(owner) if owner in MODULES else owner
    return None


def test_private_names_stay_in_their_package() -> None:
    crossings = []
    for module in MODULES:
        package = _package_of(module)
        for dotted, _, line in _imports(module):
            owner = _private_owner(dotted)
            if owner and not (package == owner or package.startswith(owner + ".")):
                crossings.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {dotted}")
    assert crossings == []


def test_the_private_rule_sees_a_crossing() -> None:
    assert _private_owner("framework.download._cluster.torchrun_group") == "framework.download"
    assert _private_owner("framework.download.manager._normalize") == "framework.download"
    assert _private_owner("framework.errors.WorkerError") is None


def test_functions_are_short() -> None:
    long = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert long == []


def test_the_download_package_defers_one_import() -> None:
    deferred = set()
    for module in MODULES:
        if not module.startswith("framework.download"):
            continue
        for dotted, in_function, _ in _imports(module):
            target = _owner(dotted)
            if in_function and target and target.startswith("framework."):
                deferred.add((module, target))
    assert deferred == DEFERRED_IN_DOWNLOAD


def test_the_architecture_map_names_real_modules_and_all_of_them() -> None:
    """ARCHITECTURE.md stays true: each file it names exists, and each engine module is on it."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"([\w/]+\.py)\b", text)) | {
        f"{name}.py" for name in re.findall(r"\b(_\w+)\b", text)
    }
    files = {path.name for path in MODULES.values()} | {
        str(path.relative_to(ROOT)) for path in MODULES.values()
    }
    files |= {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("*.py")}
    assert sorted(name for name in named if name.endswith(".py") and "/" in name and name not in files) == []
    bare = {name for name in re.findall(r"`(\w+\.py)`", text)}
    assert sorted(bare - files) == []
    engines = [path for path in MODULES.values() if path.parent.name in ("data", "download", "parallel")]
    missing = sorted(
        str(path.relative_to(ROOT))
        for path in engines
        if path.name != "__init__.py" and path.name not in named and path.stem not in text
    )
    assert missing == []


def test_the_config_layer_never_imports_the_cli_layer() -> None:
    """No module of the config (or registry) layer imports the command line, counting
    imports inside functions and importlib's: the root package joins the layers. (Once
    `framework` is imported, framework.cli.run_config is loaded: the root loads it, to
    give the config layer the run config's shape.)"""
    graph = _graph()
    lower = [m for m in graph if m.startswith(("framework.config", "framework.registry"))]
    assert lower and [(m, t) for m in lower for t in graph[m] if t.startswith("framework.cli")] == []
    code = (
        "import framework.config as c, framework.registry as r, inspect\n"
        "print(inspect.getsource(r.Registrable.from_config))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "import_module" not in out.stdout


def test_no_test_file_is_named_after_a_round() -> None:
    """Tests sit beside their unit and are named after it (CONTRIBUTING.md), not after the
    round of work that wrote them."""
    round_named = re.compile(r"test_(review|hardening|defences|round|sitting)|issue\d+")
    found = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if round_named.search(path.name)
    )
    assert found == []


def test_no_comment_tells_the_history_of_a_change() -> None:
    """A test's comment says what it guards; the history of a change lives in its commit
    (CONTRIBUTING.md)."""
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"#\s*Before:", line)
    ]
    assert found == []
