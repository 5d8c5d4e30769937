"""The package's imports point one way: each folder imports only from the folders below it
(docs/design.md), and no module imports a private name from another folder."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Bottom to top; a module may import from its own layer and the ones below.
LAYERS = [
    ("dmlgraph.errors", "dmlgraph.process"),
    ("dmlgraph.ir",),
    ("dmlgraph.io",),
    ("dmlgraph.rewrite",),
    ("dmlgraph.runtime",),
    ("dmlgraph.passes",),
    ("dmlgraph.costs", "dmlgraph.pipeline", "dmlgraph.mask_census"),
    ("dmlgraph.inspection",),
    ("dmlgraph.api",),
    ("dmlgraph.tools", "dmlgraph.integrations"),
]


def _layer(module: str) -> int | None:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def _folder(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def _modules() -> list[tuple[str, str]]:
    found = []
    for top, package in (("dmlgraph", "dmlgraph"), ("passes", "dmlgraph.passes")):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, f), os.path.join(ROOT, top))[:-3]
                    name = ".".join([package, *rel.split(os.sep)]).removesuffix(".__init__")
                    found.append((name, os.path.join(folder, f)))
    return found


def _imports(path: str) -> list[tuple[str, str | None]]:
    """(module, name) for each `from module import name` and (module, None) for `import module`."""
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
    return out


def test_every_module_has_a_layer():
    assert [m for m, _ in _modules() if m != "dmlgraph" and m != "dmlgraph.__main__" and _layer(m) is None] == []


def test_imports_point_down():
    upward = []
    for module, path in _modules():
        mine = _layer(module)
        if mine is None:  # the package's lazy __init__ and __main__ are the top
            continue
        for target, name in _imports(path):
            full = f"{target}.{name}" if name and _layer(f"{target}.{name}") is not None and target == "dmlgraph" \
                else target
            theirs = _layer(full)
            if theirs is not None and theirs > mine:
                upward.append(f"{module} imports {full}")
    assert upward == []


def test_no_private_name_crosses_a_folder():
    crossing = []
    for module, path in _modules():
        for target, name in _imports(path):
            if name and name.startswith("_") and not name.startswith("__") and target.startswith("dmlgraph") \
                    and _folder(target) != _folder(module):
                crossing.append(f"{module} imports {target}.{name}")
    assert crossing == []


# The numeric kernels are written as one loop nest each, for numba; everything else reads in one screen.
LONG_FUNCTIONS_ALLOWED = {"dmlgraph.runtime.kernels", "dmlgraph.runtime.kernels_compiled"}


def test_functions_fit_in_one_screen():
    long = []
    for module, path in _modules():
        if module in LONG_FUNCTIONS_ALLOWED:
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None \
                    and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert long == []
