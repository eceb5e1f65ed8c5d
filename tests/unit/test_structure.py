"""The package's shape: every module imports, no module imports itself back through others, the stages
depend on each other only in the pipeline's order and only on the stages each is allowed (docs/design.md,
"Package map"), and the pure core (``analysis/``, ``report/``) imports no reader, capture, process or command
line module and does no file I/O (an AST scan of every module in it)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

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
    "crash",
    "cli",
    "__main__",
)
MAX_LINES = 420  # "under about 400 lines"
# What each stage may import of mtpdiag besides itself ("errors" holds the package's own __init__: the version).
# A new dependency between stages is a design decision: it goes here, and into docs/design.md's map.
BASE = {"vocabulary", "errors", "model"}
ALLOWED = {
    "vocabulary": set(),
    "errors": set(),
    "exits": set(),
    "model": {"vocabulary"},
    "atomic": set(),
    "layout": BASE,
    "inputs": BASE | {"atomic", "layout"},
    "capture": BASE | {"atomic", "layout", "inputs"},
    "analysis": BASE | {"layout"},  # pure: no reader (pickle, files), no capture
    "lint": BASE | {"layout", "analysis"},
    "report": BASE | {"layout", "analysis"},  # pure: renders text, writes nothing
    "pipeline": BASE | {"atomic", "layout", "inputs", "capture", "analysis", "report"},
    "fix": BASE | {"atomic", "layout", "capture", "analysis", "lint", "report", "pipeline"},
    "commands": BASE
    | {"exits", "atomic", "layout", "inputs", "capture", "analysis", "lint", "report", "pipeline", "fix"},
    "crash": {"errors", "inputs"},
    "cli": {"errors", "exits", "model", "commands", "crash"},
    "__main__": {"cli"},
}
# The pure core: the only modules outside mtpdiag it may import (a new one is added here, knowingly).
PURE_STAGES = ("analysis", "report")
PURE_STDLIB = {
    "__future__",
    "abc",
    "bisect",
    "collections",
    "dataclasses",
    "enum",
    "functools",
    "heapq",
    "itertools",
    "math",
    "operator",
    "os",  # os.path's string functions only: the scan below refuses any other os call
    "re",
    "statistics",
    "string",
    "textwrap",
    "types",
    "typing",
}
PURE_EXTERNAL = {
    "analysis": PURE_STDLIB | {"msgspec"},
    "report": PURE_STDLIB | {"msgspec", "rich", "base64", "hashlib", "html", "importlib", "io", "json"},
}
# os and os.path names that touch no file, process or environment.
PURE_OS = {"path", "sep", "linesep", "fspath"}
PURE_OS_PATH = {"basename", "dirname", "join", "split", "splitext", "normpath", "isabs", "commonprefix", "sep"}
# Calls that read or write files, whatever object they are called on (pathlib, importlib.resources, io).
FILE_METHODS = {
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "open",
    "touch",
    "unlink",
    "mkdir",
    "rmdir",
    "iterdir",
    "glob",
    "rglob",
    "rename",
    "chmod",
}
FILE_BUILTINS = {"open", "print", "input"}
# Known, reviewed exceptions: (module, what the scan flags) -> why it is not the command's I/O.
ALLOWED_IO = {
    (
        "mtpdiag.report.html",
        ".read_text()",
    ): "the page's own CSS and script: package data, read as an import reads code",
}


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


def test_stages_import_only_the_stages_they_are_allowed():
    assert set(ALLOWED) == set(LAYERS)
    wrong = sorted(
        (a, b) for a, bs in graph().items() for b in bs if stage(b) != stage(a) and stage(b) not in ALLOWED[stage(a)]
    )
    assert not wrong, wrong
    assert all(LAYERS.index(b) < LAYERS.index(a) for a, bs in ALLOWED.items() for b in bs)  # the allow-list keeps order


def external_imports(tree: ast.AST) -> set[str]:
    """The top-level names of the modules outside mtpdiag that ``tree`` imports (function-level imports too)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out - {"mtpdiag"}


def file_io(tree: ast.AST) -> list[str]:
    """What in ``tree`` reads or writes a file, a stream or the environment: ``open``/``print``/``input``, a
    pathlib-style file method, an ``os`` call other than os.path's string functions, ``sys`` streams and argv."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FILE_BUILTINS:
            found.append(f"{node.func.id}()")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FILE_METHODS:
            found.append(f".{node.func.attr}()")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner, name = node.value.id, node.attr
            if (
                owner == "os"
                and name not in PURE_OS
                or owner == "sys"
                and name in ("stdout", "stderr", "stdin", "argv")
            ):
                found.append(f"{owner}.{name}")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name)
            and (node.value.value.id, node.value.attr) == ("os", "path")
            and node.attr not in PURE_OS_PATH
        ):
            found.append(f"os.path.{node.attr}")
    return found


def pure_modules() -> list[str]:
    return [n for n in modules() if stage(n) in PURE_STAGES]


def test_the_pure_core_imports_no_reader_capture_process_or_command_line_module():
    wrong = {}
    for name in pure_modules():
        extra = external_imports(ast.parse(source_of(name).read_text(encoding="utf-8"))) - PURE_EXTERNAL[stage(name)]
        if extra:
            wrong[name] = sorted(extra)
    assert not wrong, wrong
    edges = graph()  # once: it parses every module (per pure module it was 15 of the unit tier's CPU-s)
    assert not {n for n in pure_modules() if any(stage(m) in ("inputs", "capture") for m in edges[n])}
    for banned in ("subprocess", "typer", "click", "pickle", "shutil", "tempfile", "socket", "pathlib"):
        assert banned not in set().union(*PURE_EXTERNAL.values())


def test_the_pure_core_does_no_file_io():
    found = {
        (name, what)
        for name in pure_modules()
        for what in file_io(ast.parse(source_of(name).read_text(encoding="utf-8")))
    }
    assert found - set(ALLOWED_IO) == set(), sorted(found - set(ALLOWED_IO))
    assert set(ALLOWED_IO) <= found  # an exception that is gone is taken off the list


@pytest.mark.parametrize(
    "code",
    [
        "open(path).read()",
        "print(report)",
        "Path(path).write_text(text)",
        "Path(path).read_bytes()",
        "resources.files('mtpdiag').joinpath('x').open()",
        "os.remove(path)",
        "os.listdir(directory)",
        "os.environ.get('RANK')",
        "os.path.exists(path)",
        "sys.stdout.write(text)",
    ],
)
def test_the_scan_finds_file_io_when_it_is_added(code):
    """The check can fail: each of these, added to a module of the pure core, is caught."""
    assert file_io(ast.parse(f"import os, sys\nfrom pathlib import Path\n{code}\n"))


@pytest.mark.parametrize("code", ["import subprocess", "from typer import Option", "import pickle"])
def test_the_scan_finds_a_banned_import_when_it_is_added(code):
    assert external_imports(ast.parse(code)) - PURE_EXTERNAL["analysis"]
    assert external_imports(ast.parse(code)) - PURE_EXTERNAL["report"]


def test_the_scan_lets_string_work_through():
    code = "import os\nname = os.path.basename(f.file)\nparts = os.path.splitext(name)\nout = text.replace('a', 'b')\n"
    assert file_io(ast.parse(code)) == []


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
