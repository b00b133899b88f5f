"""The package's layers depend one way: Numba layer -> protocol / recorder ->
runtime -> resources -> driver, and no module imports itself back.

Read from the source with :mod:`ast`: the imports at module level (those under
``if TYPE_CHECKING:`` excepted: they never run) and those inside functions (a
late import is still a dependency).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "numba_streamsafe"

#: Layer of each part of the package, lowest first: a top-level module or
#: subpackage, or a module of ``core`` or ``diagnostics`` (whose modules sit on
#: different layers). A module may import its own layer and those below.
LAYERS = {
    "core": 0, "core.errors": 0, "core.access": 0, "core.streams": 0, "core.modes": 0,
    "core.settings": 0, "core.tracehook": 0, "compiled": 0,
    "_driver": 1, "core.blocks": 1, "core.uses": 1,
    "resources": 2,
    "runtime": 3, "stream_registry": 3,
    "protocol": 4, "diagnostics": 4, "diagnostics.recorder": 4, "diagnostics.memstats": 4,
    "diagnostics.races": 4, "diagnostics.trace_records": 4, "diagnostics.tracing": 5,
    "diagnostics.trace_export": 5,
    "graphs": 5, "pytest_plugin": 5,
    "numba": 5,
    "__init__": 6, "dask": 6, "__main__": 6,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """The package modules ``module`` imports (outside TYPE_CHECKING blocks)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            # importlib.import_module("pkg.mod") and __import__("pkg.mod") are imports too.
            names = [node.args[0].value]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _is_dynamic_import(node: ast.Call) -> bool:
    """``importlib.import_module("...")`` or ``__import__("...")`` with a literal name."""
    func = node.func
    named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))
    return named and bool(node.args) and isinstance(node.args[0], ast.Constant) and \
        isinstance(node.args[0].value, str)


def _part(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and f"{parts[1]}.{parts[2]}" in LAYERS:
        return f"{parts[1]}.{parts[2]}"
    return parts[1] if len(parts) > 1 else "__init__"


GRAPH = {m: _imports(p, m, set(_modules())) for m, p in _modules().items()}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_go_down_the_layers(module):
    layer = LAYERS[_part(module)]
    upward = sorted(m for m in GRAPH[module]
                    if m != "numba_streamsafe" and LAYERS[_part(m)] > layer)
    assert not upward, f"{module} (layer {layer}) imports a higher layer: {upward}"


def test_no_import_cycles():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(GRAPH[m]):
            if dep == "numba_streamsafe":
                continue  # the package's lazy __init__ (its names load on first use)
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[m] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_the_checker_sees_imports(tmp_path):
    """Controls: the graph holds known edges, a TYPE_CHECKING import is not one,
    and an upward import planted in a copy of a module is found."""
    assert "numba_streamsafe.resources" in GRAPH["numba_streamsafe.runtime"]
    assert "numba_streamsafe.protocol" in GRAPH["numba_streamsafe.numba.launch.kernel"]
    assert "numba_streamsafe.runtime" not in GRAPH["numba_streamsafe.protocol"]  # TYPE_CHECKING
    planted = tmp_path / "base.py"
    planted.write_text((PACKAGE / "resources" / "base.py").read_text()
                       + "\n\ndef late():\n    from numba_streamsafe.runtime import get_runtime\n")
    found = _imports(planted, "numba_streamsafe.resources.base", set(_modules()))
    assert "numba_streamsafe.runtime" in found
    hidden = tmp_path / "hidden.py"
    hidden.write_text("import importlib\n\ndef late():\n"
                      "    return importlib.import_module('numba_streamsafe.runtime')\n"
                      "def later():\n    return __import__('numba_streamsafe.protocol')\n")
    found = _imports(hidden, "numba_streamsafe.resources.hidden", set(_modules()))
    assert {"numba_streamsafe.runtime", "numba_streamsafe.protocol"} <= found


def test_no_private_name_is_imported_from_another_module():
    """A module's private names are its own: what a neighbour needs is public
    (in the module's ``__all__``). Neither ``from m import _name`` nor
    ``m._name`` on an imported package module; dunder names are allowed."""
    crossing = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        imported: dict[str, str] = {}  # local name -> what it is in the package
        for node in ast.walk(tree):
            if (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("numba_streamsafe")):
                for a in node.names:
                    imported[a.asname or a.name] = f"{node.module}.{a.name}"
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        crossing.append(f"{name} imports {node.module}.{a.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in imported and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                crossing.append(f"{name} reads {imported[node.value.id]}.{node.attr}")
    assert crossing == [], "\n".join(sorted(set(crossing)))


#: The most modules a folder of the package holds: more is a room holding
#: several concepts, to be split into sub-packages by concept.
MAX_MODULES = 12


def test_no_folder_holds_more_than_twelve_modules():
    counts = {}
    for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir()
                               and (p / "__init__.py").exists())]:
        counts[folder.relative_to(PACKAGE.parent).as_posix()] = len(list(folder.glob("*.py")))
    assert len(counts) > 5 and max(counts.values()) > 1  # the walk saw the package
    over = {k: v for k, v in counts.items() if v > MAX_MODULES}
    assert not over, f"folders of more than {MAX_MODULES} modules: {over}"


#: The highest cyclomatic complexity (radon's count) of a function of the package.
MAX_COMPLEXITY = 15


def test_no_function_is_more_complex_than_fifteen():
    cc = pytest.importorskip("radon.complexity", reason="radon (the dev extra) counts it")
    scores = {}
    for path in PACKAGE.rglob("*.py"):
        for block in cc.cc_visit(path.read_text()):
            scores[f"{path.relative_to(PACKAGE.parent)}:{block.lineno} {block.name}"] = \
                block.complexity
    assert len(scores) > 500  # the walk saw the package's functions
    over = {k: v for k, v in scores.items() if v > MAX_COMPLEXITY}
    assert not over, f"functions over complexity {MAX_COMPLEXITY}: {over}"


def _classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Every class of the package by name: ``(module, node)`` for each."""
    out: dict[str, list[tuple[str, ast.ClassDef]]] = {}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append((name, node))
    return out


def _declares_state_only(node: ast.ClassDef) -> bool:
    """A class that declares fields it never sets (bare annotations, no
    ``__init__``; not a dataclass, protocol, named tuple or abstract base,
    whose fields are an interface's): a declaration of the state of the class
    it is mixed into."""
    decorated = {ast.unparse(d).split("(")[0].rpartition(".")[2] for d in node.decorator_list}
    bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
    if "dataclass" in decorated or bases & {"Protocol", "NamedTuple", "TypedDict", "ABC"}:
        return False
    bare = any(isinstance(n, ast.AnnAssign) and n.value is None for n in node.body)
    init = any(isinstance(n, ast.FunctionDef) and n.name == "__init__" for n in node.body)
    return bare and not init


def test_no_class_is_assembled_from_mixins_over_shared_state():
    """Composition, not mixins: no class of the package derives from two of
    the package's classes, and none from another module's declaration of
    state (a class of annotations only). Parts are objects the class holds."""
    classes = _classes()
    found = []
    for entries in classes.values():
        for module, node in entries:
            bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
            ours = [b for b in bases if b in classes and b not in ("Exception", "Protocol")]
            if len(ours) > 1:
                found.append(f"{module}.{node.name} derives from {ours}")
            for base in ours:
                if any(_declares_state_only(n) and m != module for m, n in classes[base]):
                    found.append(f"{module}.{node.name} derives from {base}, a declaration of "
                                 "another module's state")
    assert len(classes) > 100  # the walk saw the package's classes
    assert found == [], "\n".join(found)


def test_the_checker_sees_mixins():
    tree = ast.parse("class State:\n    x: int\n    y: Any\n")
    assert _declares_state_only(tree.body[0])
    tree = ast.parse("class Calls:\n    x: int\n    def f(self): ...\n")
    assert _declares_state_only(tree.body[0])  # methods over fields it never sets
    tree = ast.parse("class Part:\n    x: int\n    def __init__(self): self.x = 0\n")
    assert not _declares_state_only(tree.body[0])
    tree = ast.parse("@dataclass\nclass Stats:\n    x: int\n")
    assert not _declares_state_only(tree.body[0])


def test_mark_use_counts_change_only_in_the_mark_book():
    """``Mark.refs`` is counted by ``MarkBook.hold`` and ``release`` alone: no
    other module writes it (the compiled engine calls the book's methods)."""
    writes = []
    for name, path in _modules().items():
        if name == "numba_streamsafe.resources.tracking.marks":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                       else [])
            writes += [f"{name}:{node.lineno}" for t in targets
                       if isinstance(t, ast.Attribute) and t.attr == "refs"]
    assert writes == [], writes


def test_only_the_driver_layer_talks_to_cuda():
    """CUDA is reached through ``_driver/`` alone: no other module imports
    ``cuda.bindings`` or opens a C library with ctypes (the engine calls
    libcuda's entry points through ``_driver/libcuda``)."""
    found = []
    for name, path in _modules().items():
        if name.startswith("numba_streamsafe._driver"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cuda"):
                found.append(f"{name}:{node.lineno} imports {node.module}")
            elif isinstance(node, ast.Import) and any(a.name.startswith("cuda.") for a in
                                                      node.names):
                found.append(f"{name}:{node.lineno} imports cuda")
            elif isinstance(node, ast.Attribute) and node.attr in ("CDLL", "cdll", "LoadLibrary"):
                found.append(f"{name}:{node.lineno} opens a C library")
    assert found == [], "\n".join(found)


WALK = Path(__file__).resolve().parents[2] / "scripts" / "launch_walk.py"


@pytest.mark.parametrize("build", ["compiled", "source"])
def test_a_launch_walks_down_the_rooms_once(build):
    """Following a tracked launch's arguments (``scripts/launch_walk.py``, three
    calls below ``TrackedKernel.run``, on the simulator) re-enters no module it
    has left: the kernel decides and resolves its arguments once, and hands
    them down (10 re-entries before the arguments were resolved once)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", NUMBA_STREAMSAFE_DRIVER="sim")
    if build == "source":
        env["NUMBA_STREAMSAFE_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, str(WALK), "--depth", "3", "--show"], env=env,
                         capture_output=True, text=True, check=True).stdout
    rooms = [line.strip() for line in out.splitlines() if line.startswith("   ")]
    assert rooms[0] == "numba.launch.kernel" and "protocol" in rooms, out
    assert len(rooms) == len(set(rooms)), f"a room entered twice:\n{out}"
    assert out.rstrip().endswith("returns 0"), out
