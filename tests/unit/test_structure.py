"""The package's shape: every module imports, no module imports itself back through others, and the stages
depend on each other only in the pipeline's order (docs/design.md, "Package map")."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import mtpdiag

PACKAGE = Path(mtpdiag.__file__).parent
# Run as a script under torchrun with torch and megatron-core: never imported by mtpdiag.
SCRIPTS = {"mtpdiag.fix.verify.worker"}
# The stages, bottom first: a module may import its own stage and those before it, never a later one.
LAYERS = (
    "vocabulary",
    "errors",
    "exits",
    "model",
    "atomic",
    "layout",
    "inputs",
    "capture",
    "analysis",
    "lint",
    "report",
    "pipeline",
    "fix",
    "commands",
    "cli",
    "__main__",
)
MAX_LINES = 420  # "under about 400 lines"


def modules() -> list[str]:
    names = ["mtpdiag"] + [m.name for m in pkgutil.walk_packages([str(PACKAGE)], prefix="mtpdiag.")]
    return sorted(n for n in names if n not in SCRIPTS)


def source_of(name: str) -> Path:
    path = PACKAGE.joinpath(*name.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imports(name: str, known: set[str]) -> set[str]:
    """The mtpdiag modules ``name`` imports, anywhere in its code (a function-level import counts too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source_of(name).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "mtpdiag"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mtpdiag":
            for alias in node.names:  # `from mtpdiag.x import y` is the module x.y when there is one
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in known else node.module)
    return out - {name}


def graph() -> dict[str, set[str]]:
    known = set(modules()) | SCRIPTS
    return {name: imports(name, known) & known for name in modules()}


def stage(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "errors"  # mtpdiag/__init__ holds only the version


def test_every_module_imports():
    for name in modules():
        importlib.import_module(name)


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(nxt) :] + [nxt]))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_stages_import_only_earlier_stages():
    wrong = sorted((a, b) for a, bs in graph().items() for b in bs if LAYERS.index(stage(b)) > LAYERS.index(stage(a)))
    assert not wrong, wrong


def test_every_stage_is_on_the_map_and_no_file_is_long():
    assert {stage(n) for n in modules()} <= set(LAYERS)
    long = {n: len(source_of(n).read_text(encoding="utf-8").splitlines()) for n in modules()}
    assert not {n: k for n, k in long.items() if k > MAX_LINES}


def test_no_module_pulls_in_torch_or_megatron():
    """inspect runs while a job hangs, and the wheel installs without torch: only verify's worker script,
    which torchrun starts, may import them."""
    import subprocess
    import sys

    code = (
        "import importlib, sys\n"
        f"for name in {modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron', 'verl'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
