"""The package's house rules, read from its source: no import circles, and imports flow one way between layers.

Every ``import`` counts, function-local ones included (a late import is still a dependency). The layers, lowest
first, are drawn in docs/design.md; a module may import its own package and the layers below its own.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gpuscope"

#: package (or module) -> layer; a module imports only lower layers, or modules of its own package
LAYERS = {
    "gpuscope._version": 0,
    "gpuscope.errors": 0,
    "gpuscope._util": 1,
    "gpuscope.cupti": 2,
    "gpuscope._schema": 2,
    "gpuscope.metrics": 3,
    "gpuscope._gpu": 4,
    "gpuscope._results": 5,
    "gpuscope._range_profiling": 6,
    "gpuscope._pm_sampling": 7,
    "gpuscope._pc_sampling": 7,
    "gpuscope": 8,  # the public names (imported lazily, on first use: PEP 562) and the ds.gpuscope accessor
    "gpuscope._commands": 9,
    "gpuscope.dask": 9,
    "gpuscope.mpi": 9,
    "gpuscope.cli": 10,
    "gpuscope.__main__": 11,
}

#: what a layer may import beyond its own package, where the rule is narrower than "anything below"
ONLY = {
    "gpuscope.cupti": {"gpuscope.errors"},  # the shim imports nothing above it
    "gpuscope._schema": {"gpuscope.errors", "gpuscope._util", "gpuscope._version"},
    "gpuscope.metrics": {"gpuscope.errors", "gpuscope._util", "gpuscope._schema"},  # analysis: the schema only
}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _owner(module: str) -> str:
    """The entry of LAYERS that *module* belongs to (the longest matching prefix)."""
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len, default=None)
    assert best is not None, f"{module} is in no layer: add its package to LAYERS in {__file__} and docs/design.md"
    return best


def _imports(module: str) -> set[str]:
    """The gpuscope modules *module* imports, anywhere in its source."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]) if node.level \
                else node.module or ""
            base = base.rstrip(".")
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_flow_down(module):
    mine = _owner(module)
    wrong = []
    for target in sorted(GRAPH[module]):
        theirs = _owner(target)
        if theirs == mine:
            continue
        if mine in ONLY:
            if theirs not in ONLY[mine]:
                wrong.append(f"{target} (only {sorted(ONLY[mine])} may be imported here)")
        elif LAYERS[theirs] >= LAYERS[mine]:
            wrong.append(f"{target} (layer {LAYERS[theirs]}, not below {mine}'s {LAYERS[mine]})")
    assert not wrong, f"{module} imports upward or sideways: " + "; ".join(wrong)


def test_every_module_has_a_layer_and_names_its_job():
    for module, path in MODULES.items():
        _owner(module)
        tree = ast.parse(path.read_text())
        if path.name == "__init__.py" or path.stat().st_size > 200:
            assert ast.get_docstring(tree), f"{path}: the first line says what the module is for"


def _modules(*packages: str) -> list[str]:
    out = []
    for package in packages:
        for path in sorted((PACKAGE.parent / package.replace(".", "/")).glob("*.py")):
            out.append(package if path.stem == "__init__" else f"{package}.{path.stem}")
    return out


def test_every_analysis_module_imports_first_in_a_fresh_interpreter():
    """``import gpuscope`` registers ``ds.gpuscope`` when xarray is first imported, from inside that import: a
    script whose first import is one of these modules (``from gpuscope.metrics.plot_roofline import si``) must not
    meet a half-initialised module (the tutorial did, before the accessor imported its modules lazily)."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    modules = _modules("gpuscope.metrics", "gpuscope._results")

    def first_import(module: str):
        proc = subprocess.run([sys.executable, "-c", f"import {module}; import xarray as xr; "
                               "assert hasattr(xr.Dataset, 'gpuscope')"], capture_output=True, text=True,
                              cwd=PACKAGE.parent)
        return module, proc.returncode, proc.stderr[-600:]

    with ThreadPoolExecutor(4) as pool:
        failed = [(m, err) for m, rc, err in pool.map(first_import, modules) if rc]
    assert len(modules) > 30
    assert not failed, failed


#: Modules allowed past :data:`MAX_LINES`, each with the reason; the list only shrinks.
LONG = {
    "gpuscope.cupti._types": "the structs of CUPTI's headers: a table",
}
MAX_LINES = 600


def test_modules_fit_in_a_head():
    """A module over 600 lines is split along a seam that has a name (docs/design.md: modules stay under 600)."""
    long = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    assert sorted(m for m, n in long.items() if n > MAX_LINES and m not in LONG) == []
    assert sorted(m for m in LONG if long[m] <= MAX_LINES) == []  # split since: off the list
