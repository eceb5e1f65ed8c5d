"""``mtpdiag run`` for a Ray job (verl): the Flight Recorder's variables given to the job's actors, and the job
watched through ``--ray``'s capture.

Ray starts an actor's process from the raylet of the actor's node, with the raylet's environment plus the job's
``runtime_env``. The driver's environment reaches the actors only where the driver started that raylet itself
(``ray.init()`` with no cluster to join: the raylet is its child); a driver that joins a cluster (``ray start``,
``ray job submit``, ``RAY_ADDRESS``) gives its actors nothing of its environment. So ``run`` gives the variables
as Ray gives a job its runtime_env (``plan``):

* ``ray job submit …``: in ``--runtime-env-json``, merged into the user's own (their keys win);
* any other Ray driver (verl's ``python -m verl.trainer.main_ppo``, or ``run --ray``): in
  ``RAY_JOB_CONFIG_JSON_ENV_VAR``, the variable through which Ray's job supervisor hands a submitted job's
  runtime_env to its driver. The driver's ``ray.init`` merges it with the runtime_env of its own code, env_vars
  key by key, and every task and actor of the job inherits it, merged again with the actor's own env_vars
  (verl's ``RANK``, ``WORLD_SIZE``, …). ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1`` makes a key that the driver's code
  sets itself win instead of failing ``ray.init``. A Ray Client driver (``ray.init("ray://…")``) does not read
  the variable.

``RayWatch`` is the I/O: the cluster, joined at the first sample that finds it (a driver's own ``ray.init``
starts it after the job started), and the Watcher over every node's ranks, as ``watch --ray`` samples them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from mtpdiag.errors import InputError
from mtpdiag.vocabulary.ray_launch import RayEnvRoute

if TYPE_CHECKING:
    from mtpdiag.capture.ray_cluster import RayCluster
    from mtpdiag.model import Snapshot
    from mtpdiag.pipeline import LayoutOptions
    from mtpdiag.pipeline.watcher import Watcher

JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # ray._private.runtime_env.constants; verl's main_ppo reads it too
OVERRIDE_ENV = "RAY_OVERRIDE_JOB_RUNTIME_ENV"
RUNTIME_ENV_JSON = "--runtime-env-json"
RUNTIME_ENV_FILE = "--runtime-env"
SUBMISSION_ID = "--submission-id"
STOP_S = 120.0  # how long ``ray job stop`` may take to end a submitted job (--on-hang kill)
# verl's drivers that call ray.init (verl 0.8.0); any other Ray driver is a Ray job with ``run --ray``
VERL_DRIVERS = (
    "verl.trainer.main_ppo",
    "verl.trainer.main_eval",
    "verl.trainer.main_generation_server",
    "verl.trainer.sft_trainer_ray",
)
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
# a verl Hydra override that sets a variable of the job's runtime_env on the command line
_HYDRA_ENV_VAR = re.compile(r"^\+{0,2}ray_kwargs\.ray_init\.runtime_env\.env_vars\.(\w+)=")


class RayLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """How the job is started as a Ray job: its command and the variables added to the driver's environment,
    what its actors are given and how, and the cluster ``run`` watches."""

    command: list[str]
    env: dict[str, str]
    route: RayEnvRoute
    actor_env: dict[str, str]  # what the actors are given
    kept: list[str]  # variables the job's own runtime_env sets: theirs are kept
    detected: str  # why this is a Ray job: "ray job submit", a verl driver's name, or "--ray"
    address: str  # the cluster run watches (--ray's value, or auto)
    why_not: str = ""  # RayEnvRoute.NOT_APPLIED: why, and what to do
    note: str = ""  # something about the command that run cannot change, said once
    submission_id: str = ""  # ray job submit: the job's id (the user's, or one run added), for --on-hang kill
    job_server: str = ""  # ray job submit: its --address, when given
    ray_cli: list[str] = msgspec.field(default_factory=list)  # ray job submit: the user's own Ray CLI (``ray``)

    def lines(self) -> list[str]:
        """What run says about it, one line each."""
        names = ", ".join(sorted(self.actor_env))
        if self.route == RayEnvRoute.NOT_APPLIED:
            head = f"a Ray job ({self.detected}): the actors were NOT given the Flight Recorder's variables: "
            return [head + self.why_not, f"watching the Ray cluster at {self.address} (--ray)"]
        out = [f"a Ray job ({self.detected}): its actors get {names} through {self.route}"]
        out += [f"keeping the job's own runtime_env value of {name}" for name in self.kept]
        if self.submission_id:
            out.append(f"submission id {self.submission_id}: --on-hang kill stops the job through its job server")
        return [*out, *([self.note] if self.note else []), f"watching the Ray cluster at {self.address} (--ray)"]

    def record(self) -> dict[str, Any]:
        """``run.json``'s ``ray``: what was applied and how (names only; the values are the run's paths)."""
        return {
            "detected": self.detected,
            "route": str(self.route),
            "actor_env": sorted(self.actor_env),
            "driver_env": sorted(self.env),
            "kept": self.kept,
            "address": self.address,
            **({"submission_id": self.submission_id} if self.submission_id else {}),
            **({"not_applied": self.why_not} if self.why_not else {}),
        }


def check_address(address: str | None) -> None:
    """``run --ray ADDRESS``: refused before the job starts where ``watch --ray`` would refuse it."""
    if address is None:
        return
    from mtpdiag.capture.ray_job import job_server

    server = job_server(address)
    if server is not None:
        raise InputError(
            f"run watches every second and needs a driver's connection (--ray HOST:PORT of the GCS, "
            f"ray://HEAD:10001, or auto on a node), not the job server at {server}"
        )


def launch(
    command: list[str],
    environ: Mapping[str, str],
    added: Mapping[str, str],
    kept: Mapping[str, tuple[str, str]],
    address: str | None,
) -> RayLaunch | None:
    """``plan`` with the Flight Recorder's variables as the job runs with them: mtpdiag's, and the user's own
    where they set one (``run_dir.flight_recorder_env``'s ``added`` and ``kept``)."""
    found = plan(command, environ, {**added, **{name: theirs for name, (theirs, _) in kept.items()}}, address)
    return with_submission_id(found, f"mtpdiag-run-{os.urandom(6).hex()}") if found is not None else None


def with_submission_id(found: RayLaunch, fresh: str) -> RayLaunch:
    """A submitted job with its id, so that ``--on-hang kill`` can stop it: the ``ray job submit`` client only
    reads the job's log, and killing it leaves the job running on the cluster. The user's own id, else ``fresh``
    added to the command."""
    at = submit_at(found.command)
    if at is None:
        return found
    options = _submit_options(found.command, at)
    given, _ = _option_value(options, SUBMISSION_ID)
    server = _option_value(options, "--address")[0] or ""
    cli = found.command[: at - 2]  # `ray`, or `python -m ray.scripts.scripts`: the Ray the job was given to
    if given is not None:
        return msgspec.structs.replace(found, submission_id=given, job_server=server, ray_cli=cli)
    command = [*found.command[:at], SUBMISSION_ID, fresh, *found.command[at:]]
    return msgspec.structs.replace(found, command=command, submission_id=fresh, job_server=server, ray_cli=cli)


def stop_submitted_job(found: RayLaunch) -> str:
    """``ray job stop`` of the submitted job (``--on-hang kill``, after the client was killed), with the Ray CLI it
    was submitted with (which may be another Python's than mtpdiag's); what happened, in one line. The job
    server's address is the one the job was submitted to (its ``--address``, else ``RAY_ADDRESS`` as the client
    found it)."""
    import subprocess

    server = ["--address", found.job_server] if found.job_server else []
    stop = [*found.ray_cli, "job", "stop", *server, found.submission_id]
    try:
        done = subprocess.run(stop, capture_output=True, text=True, timeout=STOP_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not stop the Ray job {found.submission_id}: {exc}"
    if done.returncode == 0:
        return f"stopped the Ray job {found.submission_id} through its job server (ray job stop)"
    last = ((done.stderr or "") + (done.stdout or "")).strip().splitlines()[-1:] or [""]
    return f"could not stop the Ray job {found.submission_id}: ray job stop exited {done.returncode}: {last[0]}"


def plan(
    command: list[str],
    environ: Mapping[str, str],
    fr_env: Mapping[str, str],
    address: str | None,
) -> RayLaunch | None:
    """The Ray launch of ``command`` (None when it is no Ray job and ``--ray`` was not given): ``fr_env`` (the
    Flight Recorder's variables, as the job runs with them) given to its actors."""
    submit = submit_at(command)
    detected = "ray job submit" if submit is not None else verl_driver(command) or ("--ray" if address else None)
    if detected is None:
        return None
    where = address or "auto"
    if submit is not None:
        return _submit_launch(command, submit, dict(fr_env), detected, where)
    return _driver_launch(command, environ, dict(fr_env), detected, where)


def submit_at(command: list[str]) -> int | None:
    """Where the options of ``ray job submit`` (``ray`` or ``python -m ray.scripts.scripts``) begin, else None."""
    for i in range(1, len(command) - 1):
        if command[i : i + 2] == ["job", "submit"]:
            before = command[i - 1]
            if os.path.basename(before) == "ray" or before == "ray.scripts.scripts":
                return i + 2
        if command[i] == "--":
            return None
    return None


def verl_driver(command: list[str]) -> str | None:
    """The verl Ray driver that ``python -m MODULE`` or ``python path/MODULE.py`` runs, else None."""
    if not command or not _PYTHON.fullmatch(os.path.basename(command[0])):
        return None
    scripts = {name.replace(".", "/") + ".py": name for name in VERL_DRIVERS}
    for i, arg in enumerate(command[1:], start=1):
        if arg == "-m" or (arg.startswith("-m") and len(arg) > 2):
            module = arg[2:] or (command[i + 1] if i + 1 < len(command) else "")
            return module if module in VERL_DRIVERS else None
        if not arg.startswith("-"):
            path = arg.replace(os.sep, "/")
            return next((name for tail, name in scripts.items() if path.endswith(tail)), None)
    return None


def _submit_launch(command: list[str], at: int, ours: dict[str, str], detected: str, address: str) -> RayLaunch:
    """``ray job submit``: the variables in ``--runtime-env-json``, the user's own keys kept."""
    options = _submit_options(command, at)
    given, value_at = _option_value(options, RUNTIME_ENV_JSON)
    base = RayLaunch(
        command=command, env={}, route=RayEnvRoute.SUBMIT_RUNTIME_ENV, actor_env=ours, kept=[], detected=detected,
        address=address,
    )  # fmt: skip
    if "--no-wait" in options:  # the client returns at once, and run with it: the job goes on unwatched
        base = msgspec.structs.replace(base, note="ray job submit --no-wait returns at once, and run with it: drop "
                                       "--no-wait so that run watches the job until it ends")  # fmt: skip
    if _option_value(options, RUNTIME_ENV_FILE)[0] is not None:
        return _not_applied(base, f"the job's runtime_env is in a {RUNTIME_ENV_FILE} file: {_add_them(ours)}")
    if given is None:
        new = [*command[:at], RUNTIME_ENV_JSON, json.dumps({"env_vars": ours}), *command[at:]]
        return msgspec.structs.replace(base, command=new)
    try:
        runtime_env = json.loads(given)
        theirs = runtime_env.get("env_vars") or {}
        runtime_env["env_vars"] = {**ours, **theirs}
    except (ValueError, AttributeError, TypeError):
        return _not_applied(base, f"its {RUNTIME_ENV_JSON} is no JSON object: {_add_them(ours)}")
    new = list(command)
    i = at + value_at
    new[i] = json.dumps(runtime_env) if new[i] == given else f"{RUNTIME_ENV_JSON}={json.dumps(runtime_env)}"
    kept = sorted(set(ours) & set(theirs))
    return msgspec.structs.replace(
        base, command=new, actor_env={k: v for k, v in ours.items() if k not in kept}, kept=kept
    )


def _driver_launch(
    command: list[str], environ: Mapping[str, str], ours: dict[str, str], detected: str, address: str
) -> RayLaunch:
    """A Ray driver: the variables in ``RAY_JOB_CONFIG_JSON_ENV_VAR``, as Ray's job supervisor gives them, merged
    into one already there (``run`` inside a submitted job); keys the job sets itself are kept."""
    on_command_line = {m.group(1) for arg in command if (m := _HYDRA_ENV_VAR.match(arg))}
    base = RayLaunch(
        command=command, env={}, route=RayEnvRoute.JOB_CONFIG_ENV, actor_env=ours, kept=[], detected=detected,
        address=address,
    )  # fmt: skip
    existing = environ.get(JOB_CONFIG_ENV)
    try:
        config = json.loads(existing) if existing else {}
        runtime_env = config.setdefault("runtime_env", None) or {}
        theirs = {**(runtime_env.get("env_vars") or {}), **dict.fromkeys(on_command_line, "")}
    except (ValueError, AttributeError, TypeError):
        return _not_applied(base, f"{JOB_CONFIG_ENV} in the environment is no JSON object: {_add_them(ours)}")
    kept = sorted(set(ours) & set(theirs))
    given = {k: v for k, v in ours.items() if k not in kept}
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **given}
    config["runtime_env"] = runtime_env
    env = {JOB_CONFIG_ENV: json.dumps(config)}
    if not existing and OVERRIDE_ENV not in environ:
        env[OVERRIDE_ENV] = "1"  # a key the driver's own ray.init sets wins, instead of failing ray.init
    return msgspec.structs.replace(base, env=env, actor_env=given, kept=kept)


def _submit_options(command: list[str], at: int) -> list[str]:
    """The options of ``ray job submit`` (from ``at``, ``submit_at``'s) up to the ``--`` before its entrypoint."""
    return command[at : command.index("--", at)] if "--" in command[at:] else command[at:]


def _option_value(options: list[str], name: str) -> tuple[str | None, int]:
    """The value of ``name VALUE`` or ``name=VALUE`` among ``options``, and its index there."""
    for i, arg in enumerate(options):
        if arg == name and i + 1 < len(options):
            return options[i + 1], i + 1
        if arg.startswith(name + "="):
            return arg[len(name) + 1 :], i
    return None, -1


def _not_applied(base: RayLaunch, why: str) -> RayLaunch:
    return msgspec.structs.replace(base, route=RayEnvRoute.NOT_APPLIED, why_not=why)


def _add_them(env: Mapping[str, str]) -> str:
    return "add to its env_vars " + json.dumps(dict(env))


class RayWatch:
    """The job's Ray cluster, joined at the first sample that finds it, and the Watcher over its ranks."""

    def __init__(self, address: str, timeout: float, event: Callable[[str], None], command: list[str]) -> None:
        from mtpdiag.layout.cmdline import layout_hints

        self.address, self.timeout, self.event = address, timeout, event
        # The driver's sizes, from the command run started (the driver may be in no session of the actors'):
        # each capture gets them after its own, as the drivers --ray finds on the nodes give theirs.
        self.hints = layout_hints(command)
        self.cluster: RayCluster | None = None
        self._waiting_said = False
        self._said: set[str] = set()  # each node's failure is said once, not at every sample

    def connect(self) -> RayCluster:
        """The connection; InputError until the cluster answers (said once in events.log)."""
        if self.cluster is None:
            from mtpdiag.capture.ray_cluster import RayCluster

            try:
                self.cluster = RayCluster(self.address, self.timeout)
            except InputError as exc:
                if not self._waiting_said:
                    self.event(f"waiting for the job's Ray cluster: {exc}")
                    self._waiting_said = True
                raise
            self.event(f"joined the Ray cluster at {self.address}")
            self.cluster.track_progress()
        return self.cluster

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None

    def list_targets(self) -> list[Any]:
        """(node id, pid) of every rank in the cluster; InputError when there are none (yet)."""
        readings, _ = self.connect().cpu()
        if not readings:
            raise InputError("no node of the Ray cluster runs a process with RANK in its environment")
        return sorted(readings)

    def take_stacks(self, options: Mapping[str, Any]) -> Callable[[list[Any], bool], Snapshot]:
        from mtpdiag.capture.ray_cluster import with_hints
        from mtpdiag.pipeline import capture_ray

        def take(_targets: list[Any], busy: bool = False) -> Snapshot:
            snapshot = capture_ray(
                self.connect(),
                said=self._said,
                native=bool(options["native"]) and not busy,
                native_timeout=float(options["native_timeout"]),
                nonblocking=busy,
                timeout=float(options["timeout"]),
            )
            return with_hints(snapshot, self.hints)

        return take

    def watcher(
        self, layout: LayoutOptions, interval: float, stall: float, pause_after: float, options: Mapping[str, Any]
    ) -> Watcher:
        """The Watcher ``run`` uses, as ``watch --ray`` builds it, armed at the first progress."""
        from mtpdiag.pipeline.watcher import Watcher

        return Watcher(
            list_targets=self.list_targets,
            take_stacks=self.take_stacks(options),
            layout=layout,
            interval=interval,
            stall=stall,
            fr_progress=_ProgressOnceJoined(self),
            read_cpu=lambda _targets: self.connect().cpu()[0],
            local_fr=False,  # the capture tasks pick the dumps up on the nodes
            arm_on_progress=True,
            pause_after=pause_after,
        )


class _ProgressOnceJoined:
    """The cluster's Flight Recorder signal (``ClusterProgress``), which exists once the cluster is joined."""

    def __init__(self, watch: RayWatch) -> None:
        self.watch = watch

    def poll(self, captures: tuple[Any, ...]) -> float | None:
        cluster = self.watch.cluster
        if cluster is None or cluster.progress is None:
            return None
        return cluster.progress.poll(captures)

    def established_at(self) -> float | None:
        cluster = self.watch.cluster
        if cluster is None or cluster.progress is None:
            return float("-inf")  # no signal yet: nothing to wait for
        return cluster.progress.established_at()
