"""The shape of the house (docs/architecture.md): imports run one way, no two-file import
circle but the one between the evolution and its adjoints (diffrax has the same one: a solve
takes an adjoint, an adjoint runs the solve's steps), files and functions stay legible, and
splitformer reads its own objects by their declared attributes, not by getattr probing.

Run ``python tests/test_architecture.py`` to print the numbers these tests bound.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "splitformer"

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 60
MAX_LONG_FUNCTIONS = 10
MAX_LITERAL_GETATTR = 60
ALLOWED_CIRCLES = {("splitformer.time.adjoints", "splitformer.time.evolution")}
# docs/architecture.md's layers, lowest first; a module may import its own layer and those below
LAYERS = {
    "files": 0, "usage": 0, "operators": 1, "time": 2, "models": 3,
    "interop": 4, "verification": 4, "analysis": 4, "control": 4, "bench": 4,
    "training": 5, "experiments": 6, "subjects": 6, "compression": 6,
    "commands": 7, "cli": 7, "__main__": 7,
    "": 7,  # the package itself: the public face, re-exports from every layer
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _trees() -> dict[str, tuple[Path, ast.Module]]:
    return {name: (path, ast.parse(path.read_text(), str(path)))
            for name, path in _modules().items()}


def _imports(name: str, path: Path, tree: ast.Module, modules) -> set[str]:
    """The splitformer modules that ``name`` imports (at any depth of its code)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
            if subs:  # from . import submodule: the submodule, not the package
                out.update(subs)
            elif target in modules:
                out.add(target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
    out.discard(name)
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports() -> list[str]:
    """Imports from a layer to one above it (at any depth of the code: lazy imports count)."""
    trees = _trees()
    out = []
    for name, (path, tree) in trees.items():
        for target in sorted(_imports(name, path, tree, trees)):
            if LAYERS[_layer(target)] > LAYERS[_layer(name)]:
                out.append(f"{name} -> {target}")
    return out


def circles() -> set[tuple[str, str]]:
    trees = _trees()
    graph = {n: _imports(n, p, t, trees) for n, (p, t) in trees.items()}
    return {tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())}


def long_files() -> list[tuple[int, str]]:
    return sorted(((len(p.read_text().splitlines()), str(p.relative_to(SRC)))
                   for p in _modules().values()), reverse=True)


def long_functions() -> list[tuple[int, str]]:
    out = []
    for path, tree in _trees().values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append((n, f"{path.relative_to(SRC)}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def literal_getattrs() -> list[str]:
    """getattr(x, "name") and hasattr(x, "name") calls with a literal attribute name."""
    out = []
    for path, tree in _trees().values():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)):
                out.append(f"{path.relative_to(SRC)}:{node.lineno} {node.func.id}("
                           f"{ast.unparse(node.args[0])}, {node.args[1].value!r})")
    return out


def test_every_package_is_in_a_layer():
    assert {_layer(m) for m in _modules()} <= set(LAYERS), sorted(
        {_layer(m) for m in _modules()} - set(LAYERS))


def test_imports_go_one_way():
    assert not upward_imports(), upward_imports()


def test_no_import_circle_but_the_evolution_and_its_adjoints():
    assert circles() <= ALLOWED_CIRCLES, sorted(circles() - ALLOWED_CIRCLES)


def test_no_source_file_over_800_lines():
    over = [(n, f) for n, f in long_files() if n > MAX_FILE_LINES]
    assert not over, over


def test_at_most_ten_functions_over_60_lines():
    found = long_functions()
    assert len(found) <= MAX_LONG_FUNCTIONS, found


def test_own_objects_read_by_declared_attributes_not_getattr_probing():
    found = literal_getattrs()
    assert len(found) <= MAX_LITERAL_GETATTR, "\n".join(found)


def test_the_reversible_scheme_is_defined_with_the_other_schemes():
    from splitformer.time import adjoints, schemes

    scheme = schemes.SCHEMES["reversible"]
    assert scheme.__module__.startswith("splitformer.time.schemes"), scheme.__module__
    assert "SCHEMES" not in adjoints.__dict__  # no registration as an import side effect


if __name__ == "__main__":
    print("files over", MAX_FILE_LINES, "lines:",
          [x for x in long_files() if x[0] > MAX_FILE_LINES])
    print("functions over", MAX_FUNCTION_LINES, "lines:", len(long_functions()))
    for n, f in long_functions():
        print(f"  {n:4d} {f}")
    print("literal getattr/hasattr:", len(literal_getattrs()))
    print("two-file import circles:", sorted(circles()))
    print("imports from a layer to one above it:", upward_imports())
