"""The typer options several subcommands share, spelled once; the stages they run are ``mtpdiag.pipeline``."""

from __future__ import annotations

from typing import Any

import typer

from mtpdiag.errors import InputError
from mtpdiag.report import RENDERERS
from mtpdiag.vocabulary.states import OutputFormat

# typer options (module-level so every command spells them the same way)
PID = typer.Option(None, "--pid", help="A worker pid, or a launcher (torchrun agent, raylet) to expand. Repeatable.")
ALL = typer.Option(False, "--all", help="Every process on this host whose environment has RANK and WORLD_SIZE.")
NATIVE = typer.Option(
    False,
    "--native",
    help="Pass --native to py-spy: C/C++ frames too, as evidence of what "
    "each rank waits on (the call site stays the Python one).",
)
NATIVE_TIMEOUT = typer.Option(
    30.0,
    "--native-timeout",
    min=0.1,
    help="Seconds to wait for each --native dump before dumping that rank again without it.",
)
NONBLOCKING = typer.Option(False, "--nonblocking", help="Never pause the targets (py-spy --nonblocking).")
TIMEOUT = typer.Option(10.0, "--timeout", min=0.1, help="Seconds to wait for each py-spy dump.")
TP = typer.Option(None, "--tp", min=1, help="Tensor-parallel size.")
CP = typer.Option(None, "--cp", min=1, help="Context-parallel size.")
PP = typer.Option(None, "--pp", min=1, help="Pipeline-parallel size.")
EP = typer.Option(None, "--ep", min=1, help="Expert-parallel size.")
ETP = typer.Option(None, "--etp", min=1, help="Expert tensor-parallel size.")
VPP = typer.Option(None, "--vpp", min=1, help="Virtual pipeline size.")
ORDER = typer.Option(None, "--order", help="Megatron rank order (default tp-cp-ep-dp-pp).")
CONFIG = typer.Option(None, "--config", help="A verl config YAML to read the parallel sizes from.")
OVERRIDE = typer.Option(None, "--override", help="A hydra key=value override for --config. Repeatable.")
# ``--format``'s choices are the renderer registry's keys (``mtpdiag.report.RENDERERS``), and its help their words.
Format = OutputFormat
FORMAT = typer.Option(
    None,
    "--format",
    case_sensitive=False,
    help="The report on stdout: " + ", ".join(f"{r.name} ({r.says})" for r in RENDERERS.values()) + ".",
)
JSON = typer.Option(False, "--json", help="Print the mtpdiag.report/2 JSON document (--format json).")
MARKDOWN = typer.Option(False, "--markdown", help="Print a markdown report for an incident ticket (--format markdown).")
HTML = typer.Option(None, "--html", help="Also write a self-contained HTML report to this file.")
RAY = typer.Option(
    None,
    "--ray",
    metavar="[ADDRESS]",
    help="Capture every node of a Ray cluster through Ray "
    "itself (no pdsh, no shared directory): a capture task pinned to each node, its bundle back "
    "through Ray's object store. ADDRESS defaults to auto (RAY_ADDRESS, or the cluster this node "
    "runs); HOST:PORT of the GCS joins as a Ray driver, which listens on a port; ray://HEAD:10001 "
    "(Ray Client) and http://HEAD:8265 (the job server, as ray job submit; not for watch) open no port "
    "here. Needs mtpdiag and py-spy on every node, and Ray here: pip install 'mtpdiag\\[ray]'.",
)
RAY_TIMEOUT = typer.Option(
    60.0,
    "--ray-timeout",
    min=1.0,
    help="Seconds to wait for every node's capture task "
    "under --ray; a node still busy then is reported as not captured.",
)

# Options whose value may be left out, and what they mean then (``--ray`` alone is ``--ray auto``).
OPTIONAL_VALUES = {"--ray": "auto"}


def fill_optional_values(argv: list[str]) -> list[str]:
    """The command line with each ``OPTIONAL_VALUES`` option that has no value given its default: typer's
    options take a value or none, never an optional one."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg == "--":
            return out + argv[i + 1 :]
        if arg in OPTIONAL_VALUES and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append(OPTIONAL_VALUES[arg])
    return out


def ray_cluster(
    address: str | None,
    timeout: float,
    pid: list[int] | None,
    all_: bool,
    host: str | None = None,
    command: str = "inspect",
) -> Any:
    """The connection ``--ray ADDRESS`` asks for (None without ``--ray``): a Ray driver's, or with an
    ``http(s)://`` job server, capture jobs'. The flags that pick local processes are refused with it, and
    ``watch`` with a job server, before anything connects."""
    if address is None:
        return None
    if pid or all_ or host:
        flag = "--pid" if pid else "--all" if all_ else "--host"
        raise InputError(f"--ray captures every node's ranks and names each node itself: drop {flag}")
    from mtpdiag.capture.ray_job import RayJobCluster, job_server

    server = job_server(address)
    if server is not None and command == "watch":
        raise InputError(
            f"watch samples every second and needs a driver's connection (--ray HOST:PORT of the "
            f"GCS, or auto on a node), not the job server at {server}; inspect and collect take it"
        )
    if server is not None:
        return RayJobCluster(server, timeout)
    from mtpdiag.capture.ray_cluster import RayCluster

    return RayCluster(address, timeout)


def output_format(fmt: OutputFormat | None, as_json: bool, as_markdown: bool) -> OutputFormat:
    """The one format asked for by ``--format`` and its aliases ``--json`` and ``--markdown``. Contradictory
    flags are refused here, before anything is captured or sampled."""
    if as_json and as_markdown:
        raise InputError("choose one of --json and --markdown")
    alias = OutputFormat.JSON if as_json else OutputFormat.MARKDOWN if as_markdown else None
    if fmt is not None and alias is not None and fmt != alias:
        raise InputError(f"--format {fmt} and --{alias} ask for different formats: choose one")
    return alias or fmt or OutputFormat.CONSOLE
