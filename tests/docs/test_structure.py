"""The source tree's shape, checked: no import cycle, no oversized file, solvers that ask problems (never test their
class or read their private fields), registry names defined once."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "inferlearn"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks (imports for annotations only, never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def import_graph() -> dict[str, set[str]]:
    """``module → the library modules it imports`` (at any depth of the file: lazy imports count too). ``from P
    import n`` reads ``P.n`` when that is a module, else ``P``; imports for annotations only do not count."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        out = graph.setdefault(module, set())
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in MODULES)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path, node)
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in MODULES:
                        out.add(target)
                    elif base in MODULES and base != module:
                        out.add(base)
        out.discard(module)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        colour[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if colour.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if not colour.get(n):
                found = visit(n)
                if found:
                    return found
        stack.pop()
        colour[m] = 2
        return None

    for m in sorted(graph):
        if not colour.get(m):
            found = visit(m)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_the_library():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_source_file_is_over_600_lines(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(SRC)} has {n} lines (> {MAX_LINES}): split it by concept"


SOLVERS = sorted((PACKAGE / "engine" / "solvers").glob("*.py"))
#: ``obj._name`` where ``obj`` is not ``self``/``cls`` and not a module whose underscored functions are its API
_PRIVATE = re.compile(r"(?<![\w.])(?!self\.|cls\.|torch\.)([A-Za-z_]\w*)\._[A-Za-z]\w*")


def _code(path: Path) -> str:
    """The file without its docstrings and comments (what runs)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    return ast.unparse(tree)


@pytest.mark.parametrize("path", SOLVERS, ids=lambda p: p.name)
def test_solvers_ask_problems_and_never_test_their_class(path):
    code = _code(path)
    assert not re.search(r"isinstance\([^)]*Problem", code), f"{path.name} tests a problem's class"
    private = [m.group(0) for m in _PRIVATE.finditer(code)]
    assert not private, f"{path.name} reads another object's private attributes: {private}"
    assert "__dict__" not in code, f"{path.name} caches on another object's __dict__"


def test_the_private_attribute_check_can_fail():
    code = "def f(problem, self):\n    return problem._free_res, self._ok, torch._foreach_abs([])\n"
    assert [m.group(0) for m in _PRIVATE.finditer(code)] == ["problem._free_res"]


def test_solvers_import_no_problem_module():
    graph = import_graph()
    for m in graph:
        if m.startswith("inferlearn.engine.solvers"):
            bad = [n for n in graph[m] if n.startswith("inferlearn.engine.problems")]
            assert not bad, f"{m} imports {bad}: solvers see problems only through the protocol"


def _registries() -> dict[str, list[str]]:
    """Module-level ALL-CAPS names (the registries and vocabularies) → the modules that assign them."""
    out: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and re.fullmatch(r"[A-Z][A-Z0-9_]+", t.id):
                    out.setdefault(t.id, []).append(module)
    return out


def test_every_registry_name_is_defined_once():
    twice = {name: mods for name, mods in _registries().items() if len(mods) > 1}
    assert not twice, f"names defined in several modules, with different meanings: {twice}"


def test_one_activation_registry():
    from inferlearn.models.activations import ACTIVATIONS

    regs = [n for n in _registries() if "ACTIVATION" in n and not n.endswith("_TYPES")]
    assert regs == ["ACTIVATIONS"], regs
    from inferlearn.admm.blocks import mlp

    assert [type(m).__name__ for m in mlp("4-3-2", act="gelu")] == ["Flatten", "Linear", "GELU", "Linear"]
    assert "gelu" in ACTIVATIONS


REPO = SRC.parent


def _tracked(prefix: str) -> list[Path]:
    import subprocess

    out = subprocess.run(["git", "ls-files", prefix], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        pytest.skip("not a git checkout")
    return [REPO / p for p in out.stdout.split() if (REPO / p).exists()]


def test_committed_benchmark_results_stay_small():
    size = sum(p.stat().st_size for p in _tracked("benchmarks/results"))
    assert size <= 5e6, f"benchmarks/results holds {size / 1e6:.1f} MB (> 5 MB): commit tables and the pictures the docs embed"


def test_no_benchmark_json_is_committed_and_benchmarks_stay_a_quarter_of_the_lines():
    """The benchmark tables' results.json and pcx.json live in the history (``--reuse REVISION:PATH``), and
    benchmarks/ holds at most a quarter of the repository's text lines (files without a NUL byte)."""
    committed = [p.relative_to(REPO).as_posix() for p in _tracked("benchmarks") if p.suffix == ".json"]
    assert not committed, f"benchmark JSON committed (keep it in the history; benchmarks/README.md): {committed}"

    def lines(p: Path) -> int:
        data = p.read_bytes()
        return 0 if b"\0" in data[:8000] else data.count(b"\n")
    ours, total = sum(map(lines, _tracked("benchmarks"))), sum(map(lines, _tracked(".")))
    assert ours <= total / 4, f"benchmarks/ holds {ours} of {total} text lines ({ours / total:.1%} > 25 %)"


def test_every_results_table_names_the_command_that_makes_it():
    made = re.compile(r"\binferlearn (?:train|compare|reproduce|benchmark|admm)\b|\b[A-Za-z0-9_/]+\.py\b")
    nameless = [p.relative_to(REPO).as_posix() for p in _tracked("benchmarks/results")
                if p.suffix == ".md" and not made.search(p.read_text())]
    assert not nameless, f"results files that name no command: {nameless}"


def test_benchmark_scripts_import_the_installed_package():
    inserts = [p.relative_to(REPO).as_posix() for p in _tracked("benchmarks") if p.suffix == ".py"
               and re.search(r"sys\.path\.insert\(0, str\([^)]*\"src\"\)", p.read_text())]
    assert not inserts, f"scripts that put src/ on sys.path instead of importing the installed package: {inserts}"
