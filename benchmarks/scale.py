"""Time ``mtpdiag analyze DIR --json`` on synthetic N-rank inputs against a json.loads baseline.

Usage: python benchmarks/scale.py [--shapes bundle,pyspy] [--sizes 1024,4096,16384] [--per-host 8]
                                  [--repeat 3] [--profile]

The captures are the recorded MTP-CP hang (tests/fixtures/captures/mtp_cp_pp: cp=2, pp=2, real py-spy
dumps of a real torchrun+gloo job) tiled over dp replicas until the world has N ranks, in two shapes:

* ``bundle``: one real ``mtpdiag.bundle/1`` per host (``node-0000`` ...), ``--per-host`` ranks each, with
  the environment a ``collect`` bundle carries (tiled with ``tests/support/captures.py:tile``);
* ``pyspy``: one ``py-spy dump --json --locals`` file per rank (``rank0.json`` ...): the recorded rank's own
  file with the same (tp, cp, pp) coordinates, its pids and its send's ``dst``/``src`` moved to the new
  rank (py-spy files carry no WORLD_SIZE, so analyze gets ``--world-size N``).

Each shape and size is then measured in the same run:

* baseline: a fresh interpreter that ``json.loads`` every file and keeps the results;
* analyze:  ``python -m mtpdiag analyze DIR --cp 2 --pp 2 [--world-size N] --json > /dev/null``.

Both are subprocesses (both pay interpreter start-up, both may cache bytecode as an installed package
does), run alternately after one warm-up each; wall time is the median, memory the peak RSS of the child
(``os.wait4``); CPU (user+sys) is shown too, as it is steadier than wall time on a shared machine. Above
the goal of 1.0x at the largest size (or with ``--split``), the CPU split of the in-process steps
(start-up, load_paths, diagnose, JSON render) is printed. ``--profile`` adds a cProfile listing.
No assertions.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from mtpdiag.model import replace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from mtpdiag.inputs.bundle import bundle_path, bundle_text
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Env, Snapshot
from support.captures import load_scenario, scenario_dir, tile

SCENARIO = "mtp_cp_pp"
GOAL_RATIO = 1.0
BASELINE_PROGRAM = """
import json, os, sys
kept = []
for root, _, files in os.walk(sys.argv[1]):
    for name in sorted(files):
        with open(os.path.join(root, name), encoding="utf-8") as f:
            kept.append(json.loads(f.read()))
print(len(kept))
"""


# ---------------------------------------------------------------- synthesis


def synthesize(world: int, per_host: int, directory: str) -> int:
    """Write ``world // per_host`` host bundles of the tiled recorded hang into ``directory``."""
    snapshot, layout, meta = load_scenario(SCENARIO)
    sizes = meta["layout"]
    big = ParallelLayout.for_world(world, tp=sizes.get("tp", 1), cp=sizes.get("cp", 1), pp=sizes.get("pp", 1))
    tiled = tile(snapshot, layout, big)
    hints = {k: v for k, v in sizes.items() if v > 1}
    written = 0
    for first in range(0, world, per_host):
        node = first // per_host
        host = f"node-{node:04d}"
        captures = tuple(
            replace(c, host=host, source=None, layout_hints=hints, env=_collect_env(c.rank, world, per_host))
            for c in tiled.captures[first : first + per_host]
        )
        bundle = Snapshot(
            captures=captures, host=host, created=snapshot.created or "2026-01-01T00:00:00+00:00", tool_version="0.1.0"
        )
        # save_bundle's format without its fsync (2,048 fsyncs would dominate the set-up time)
        with open(bundle_path(bundle, directory), "w", encoding="utf-8") as f:
            f.write(bundle_text(bundle))
        written += 1
    return written


def synthesize_pyspy(world: int, directory: str) -> int:
    """Write one ``py-spy dump --json`` file per rank: the recorded rank with the same (tp, cp, pp)
    coordinates, with the new rank's pids and its send's or recv's peer moved as ``tile`` moves it."""
    _, layout, meta = load_scenario(SCENARIO)
    sizes = meta["layout"]
    big = ParallelLayout.for_world(world, tp=sizes.get("tp", 1), cp=sizes.get("cp", 1), pp=sizes.get("pp", 1))
    recorded = {}
    for rank in range(layout.world_size):
        co = layout.coords(rank)
        with open(os.path.join(scenario_dir(SCENARIO), f"rank{rank}.json"), encoding="utf-8") as f:
            recorded[(co["tp"], co["cp"], co["pp"])] = (rank, json.load(f))
    for rank in range(world):
        co = big.coords(rank)
        old, doc = recorded[(co["tp"], co["cp"], co["pp"])]
        doc = json.loads(json.dumps(doc))
        for thread in doc:
            thread["pid"] = thread["os_thread_id"] = 1_000_000 + rank
            for frame in thread["frames"]:
                for local in frame.get("locals") or ():
                    if local["name"] in ("dst", "src"):
                        stage = layout.coords(int(local["repr"]))["pp"] - layout.coords(old)["pp"]
                        stages = big.group_of("pp", rank)
                        local["repr"] = str(stages[(stages.index(rank) + stage) % len(stages)])
        with open(os.path.join(directory, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=2) + "\n")
    return world


SHAPES = {"bundle": "host bundles", "pyspy": "py-spy JSON files"}


def _collect_env(rank: int, world: int, per_host: int) -> Env:
    """The whitelisted keys torchrun gives a worker, as ``collect`` stores them."""
    return Env(
        RANK=str(rank),
        LOCAL_RANK=str(rank % per_host),
        WORLD_SIZE=str(world),
        GROUP_RANK=str(rank // per_host),
        LOCAL_WORLD_SIZE=str(per_host),
        MASTER_ADDR="node-0000",
        MASTER_PORT="29500",
    )


# ---------------------------------------------------------------- measurement


CHILD_ENV = dict(os.environ)


def use_bytecode_cache(directory: str) -> None:
    """Let the children cache bytecode (in ``directory``), as an installed package has its .pyc files.

    Without this, a shell with PYTHONDONTWRITEBYTECODE set (CI images often set it) makes every
    ``analyze`` recompile mtpdiag's modules, which the baseline, one small program, hardly pays.
    """
    CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    CHILD_ENV["PYTHONPYCACHEPREFIX"] = directory


def run_child(argv: list[str]) -> tuple[float, float, float, int]:
    """Wall seconds, CPU seconds, peak RSS in MB and exit status of one child (stdout discarded)."""
    began = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=CHILD_ENV
    )
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace").strip()
    proc.stderr.close()
    if proc.returncode not in (0, 1) and argv[-1] != MISSING:
        print(f"  ! {' '.join(argv[1:4])} exited {proc.returncode}: {err.splitlines()[-1:] if err else ''}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode


def measure(directory: str, repeat: int, layout_flags: list[str]) -> dict:
    baseline = [sys.executable, "-c", BASELINE_PROGRAM, directory]
    analyze = [sys.executable, "-m", "mtpdiag", "analyze", directory, *layout_flags, "--json"]
    runs: dict[str, list[tuple[float, float, float, int]]] = {"baseline": [], "analyze": []}
    run_child(baseline), run_child(analyze)  # warm-up: bytecode compiled and files in the page cache
    for _ in range(repeat):
        runs["baseline"].append(run_child(baseline))
        runs["analyze"].append(run_child(analyze))
    out = {}
    for name, rows in runs.items():
        out[name + "_s"] = statistics.median(r[0] for r in rows)
        out[name + "_cpu"] = statistics.median(r[1] for r in rows)
        out[name + "_mb"] = max(r[2] for r in rows)
        out[name + "_exit"] = rows[-1][3]
    pairs = list(zip(runs["analyze"], runs["baseline"], strict=True))
    out["ratio"] = statistics.median(a[0] / b[0] for a, b in pairs)
    out["cpu_ratio"] = statistics.median(a[1] / b[1] for a, b in pairs)
    return out


def phase_split(directory: str, layout_flags: dict, world_size: int | None) -> dict[str, float]:
    """CPU seconds of each step ``analyze --json`` takes, in-process, next to json.loads of the same files
    and the start-up."""
    from mtpdiag.inputs import load_paths
    from mtpdiag.pipeline import LayoutOptions, diagnose_snapshot, with_world_size
    from mtpdiag.report import json_report

    steps: dict[str, float] = {}

    def step(name, fn, *args):
        """Run ``fn`` three times and keep the least CPU: on a shared machine noise only ever adds."""
        best, result = None, None
        for _ in range(3):
            result = None  # the previous run's result is freed before the next run
            began = time.process_time()
            result = fn(*args)
            spent = time.process_time() - began
            best = spent if best is None else min(best, spent)
        steps[name] = best
        return result

    def read_all() -> list:
        kept = []
        for name in sorted(os.listdir(directory)):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                kept.append(json.loads(f.read()))
        return kept

    def load() -> object:
        snapshot = load_paths([directory])
        return with_world_size(snapshot, world_size) if world_size else snapshot

    steps[INTERPRETER] = min(run_child([sys.executable, "-c", "pass"])[1] for _ in range(5))
    steps[STARTUP] = min(run_child([sys.executable, "-m", "mtpdiag", "analyze", MISSING])[1] for _ in range(5))
    step(PARSE, read_all)
    snapshot = step(LOAD, load)
    options = LayoutOptions(**layout_flags, world_size=world_size)
    report = step(DIAGNOSE, diagnose_snapshot, snapshot, options)
    # what --json prints: the document's bytes where the tree has them (the tree before printed render's str)
    step(RENDER, getattr(json_report, "document", json_report.render), report)
    return steps


INTERPRETER = "interpreter alone (python -c pass)"
STARTUP = "interpreter + analyze's imports (analyze of a missing path)"
PARSE = "json.loads only (the baseline's work)"
LOAD = "load_paths (read + decode + merge)"
DIAGNOSE = "resolve layout + diagnose"
RENDER = "json_report.document (render on older trees)"
MISSING = "/nonexistent/mtpdiag-scale-start-up"


def profile(directory: str, layout_flags: dict, world_size: int | None, top: int = 25) -> str:
    """cProfile of what ``analyze --json`` does in-process: load, diagnose, render."""
    from mtpdiag.inputs import load_paths
    from mtpdiag.pipeline import LayoutOptions, diagnose_snapshot
    from mtpdiag.report import json_report

    profiler = cProfile.Profile()
    profiler.enable()
    report = diagnose_snapshot(load_paths([directory]), LayoutOptions(**layout_flags, world_size=world_size))
    json_report.render(report)
    profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("cumulative").print_stats(r"mtpdiag|json", top)
    stats.sort_stats("tottime").print_stats(top)
    return stream.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes",
        default="bundle,pyspy",
        help="comma-separated: bundle (host bundles), pyspy (one py-spy JSON file per rank)",
    )
    parser.add_argument("--sizes", default="1024,4096,16384", help="comma-separated world sizes")
    parser.add_argument("--per-host", type=int, default=8, help="ranks per host bundle")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--split", action="store_true", help="the CPU split of the steps at the largest size")
    parser.add_argument("--profile", action="store_true", help="cProfile the largest size in-process")
    parser.add_argument("--keep", action="store_true", help="keep the synthesized inputs (prints where)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = [s for s in args.shapes.split(",") if s]
    if not set(shapes) <= set(SHAPES):
        parser.error(f"--shapes: one or more of {', '.join(SHAPES)}")
    _, _, meta = load_scenario(SCENARIO)
    layout = {k: v for k, v in meta["layout"].items() if k in ("tp", "cp", "pp", "ep") and v > 1}
    flags = [x for k, v in layout.items() for x in (f"--{k}", str(v))]
    root = tempfile.mkdtemp(prefix="mtpdiag-scale-")
    use_bytecode_cache(os.path.join(root, "pycache"))
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores")
    rows = []
    try:
        for shape in shapes:
            for world in sizes:
                directory = os.path.join(root, f"{shape}-n{world}")
                os.makedirs(directory)
                began = time.monotonic()
                if shape == "bundle":
                    files, extra = synthesize(world, args.per_host, directory), []
                else:
                    files, extra = synthesize_pyspy(world, directory), ["--world-size", str(world)]
                mb = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)) / 2**20
                print(
                    f"{shape} N={world}: {files} {SHAPES[shape]}, {mb:.1f} MB, synthesized in "
                    f"{time.monotonic() - began:.1f} s",
                    flush=True,
                )
                row = measure(directory, args.repeat, flags + extra)
                row.update(shape=shape, world=world, files=files, input_mb=mb, directory=directory)
                rows.append(row)
                print(
                    f"  baseline {row['baseline_s']:.2f} s, analyze {row['analyze_s']:.2f} s "
                    f"(exit {row['analyze_exit']}), ratio {row['ratio']:.2f}",
                    flush=True,
                )
        print(f"\nload average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(
            "wall = median wall seconds; cpu = median user+sys seconds (steadier on a shared machine); "
            "ratios are medians of the per-pair ratios"
        )
        print(
            f"{'shape':>6} {'N':>6} {'files':>6} {'in MB':>6} {'base wall':>10} {'analyze wall':>13} {'ratio':>6} "
            f"{'base cpu':>9} {'analyze cpu':>12} {'cpu ratio':>10} {'base MB':>8} {'analyze MB':>11}"
        )
        for r in rows:
            print(
                f"{r['shape']:>6} {r['world']:>6} {r['files']:>6} {r['input_mb']:>6.1f} {r['baseline_s']:>10.2f} "
                f"{r['analyze_s']:>13.2f} {r['ratio']:>6.2f} {r['baseline_cpu']:>9.2f} {r['analyze_cpu']:>12.2f} "
                f"{r['cpu_ratio']:>10.2f} {r['baseline_mb']:>8.0f} {r['analyze_mb']:>11.0f}"
            )
        for shape in shapes:
            mine = [r for r in rows if r["shape"] == shape]
            first, last = mine[0], mine[-1]
            if len(mine) > 1:
                print(
                    f"{shape}: growth {first['world']} -> {last['world']} ranks "
                    f"(x{last['world'] / first['world']:.0f}): "
                    f"analyze wall x{last['analyze_s'] / first['analyze_s']:.1f}, analyze peak RSS "
                    f"x{last['analyze_mb'] / first['analyze_mb']:.1f} "
                    f"(input x{last['input_mb'] / first['input_mb']:.1f})"
                )
            verdict = "within" if last["ratio"] <= GOAL_RATIO else "ABOVE"
            print(
                f"{shape}: ratio at N={last['world']}: {last['ratio']:.2f} wall, {last['cpu_ratio']:.2f} cpu "
                f"({verdict} the goal of {GOAL_RATIO})"
            )
            if args.split or args.profile or last["ratio"] > GOAL_RATIO:
                world_size = last["world"] if shape == "pyspy" else None
                print(f"\nwhere analyze spends its CPU ({shape}, N={last['world']}; in-process, no profiler):")
                for name, seconds in phase_split(last["directory"], layout, world_size).items():
                    print(f"  {seconds:6.2f} s  {name}")
                if args.profile:
                    print()
                    print(profile(last["directory"], layout, world_size))
    finally:
        if args.keep:
            print(f"inputs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
