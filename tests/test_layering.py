"""The package's layers: models know nothing of ranks, data nothing of what consumes it, and no import cycles.

Read from the source (every ``import`` statement, also inside functions; not those under ``if TYPE_CHECKING``),
so a lazy import cannot hide a dependency.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "haloflow"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str) -> set[str]:
    """Every module ``name`` imports (names resolved to modules where they are modules)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{a.name}" for a in child.names if f"{base}.{a.name}" in MODULES)
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _offenders(layer: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{name} imports {dep}" for name, deps in GRAPH.items()
                  if name == layer or name.startswith(layer + ".")
                  for dep in deps if any(dep == f or dep.startswith(f + ".") for f in forbidden))


def test_models_know_nothing_of_ranks():
    assert _offenders("haloflow.models", ("torch.distributed", "haloflow.engine")) == []


def test_data_knows_nothing_of_what_consumes_it():
    assert _offenders("haloflow.data", ("haloflow.partition", "haloflow.engine", "haloflow.models")) == []


def test_partitioning_does_not_depend_on_training():
    assert _offenders("haloflow.partition", ("haloflow.engine", "haloflow.models", "haloflow.cli")) == []


def test_the_library_never_imports_its_command_line():
    assert _offenders("haloflow.engine", ("haloflow.cli", "haloflow.bench")) == []


def test_no_import_cycles():
    internal = {name: {d for d in deps if d in MODULES and d != name} for name, deps in GRAPH.items()}
    cycles = _strongly_connected(internal)
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


@pytest.mark.parametrize("cycle", [{"a": {"b"}, "b": {"a"}, "c": set()}, {"a": {"b"}, "b": {"c"}, "c": {"a"}}])
def test_the_cycle_finder_finds_cycles(cycle):
    assert _strongly_connected(cycle) != []
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm; the components with more than one module (the cycles)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


# What makes a file a kernel rather than math: a compiled body, a device test, a hand-written backward. They live
# in haloflow/kernels (each op once, its stock formula beside its bodies); the models call the ops.
KERNEL_MARKS = ("device.type", "numba", "@njit", "autograd.Function")


def _kernel_marks(layer: str) -> list[str]:
    return sorted(f"{path.relative_to(PACKAGE.parent)}:{i}: {line.strip()}"
                  for name, path in MODULES.items() if name == layer or name.startswith(layer + ".")
                  for i, line in enumerate(path.read_text().splitlines(), 1)
                  if any(mark in line for mark in KERNEL_MARKS))


def test_models_read_as_math_their_kernels_live_in_the_kernels_room():
    assert _kernel_marks("haloflow.models") == []


def test_the_kernel_finder_finds_kernels():
    assert any("@njit" in hit for hit in _kernel_marks("haloflow.kernels"))
    assert any("autograd.Function" in hit for hit in _kernel_marks("haloflow.kernels"))


def test_kernels_know_nothing_of_models_engines_or_ranks():
    assert _offenders("haloflow.kernels", ("haloflow.models", "haloflow.engine", "torch.distributed")) == []
