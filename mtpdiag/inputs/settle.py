"""Dumped processes of one pasted file → RankCaptures: the same rules for every text format.

* A torchrun agent's own section (``py-spy dump --subprocesses``) is no rank when workers are there.
* Python and native dumps of one pid pasted together are one process: the native dump is kept (its
  stack interleaves both), with the torch.distributed arguments the Python dump may add; said in a note.
  Two plain dumps of one pid keep the last one (the later moment), also said.
* A process with no frame is a rank that could not be read (``state="unreadable"``, its ``error`` the
  reason), never a healthy one.
* Ranks come from ``identity.rank_of``; job-wide keys (WORLD_SIZE, ...) from any line of the file.
"""

from __future__ import annotations

from mtpdiag.errors import InputError
from mtpdiag.inputs.base import Dumped, FileCaptures, ReadContext
from mtpdiag.inputs.identity import rank_of
from mtpdiag.inputs.lines import JOB_KEYS, Line, env_lines
from mtpdiag.model import STATE_UNKNOWN, STATE_UNREADABLE, UNKNOWN_HOST, Env, Frame, RankCapture, ThreadStack, replace


def captures_of(
    path: str, form: str, dumps: list[Dumped], lines: list[Line], context: ReadContext, notes: list[str] | None = None
) -> FileCaptures:
    """The captures of one file read by the reader named ``form`` (``notes``: the reader's own)."""
    notes = list(notes or ())
    workers = [d for d in dumps if not d.launcher]
    dumps = _merge_same_pid(path, workers or dumps, notes)
    single = len(dumps) == 1
    job_env = {k: v for k, v in env_lines(line.body for line in lines).items() if k in JOB_KEYS}
    captures = []
    for dump in dumps:
        rank = rank_of(dump, path, single, context.rank_from)
        env = (
            {**job_env, **env_lines(line.body for line in dump.context)}
            if not single
            else env_lines(line.body for line in lines)
        )
        readable = dump.error is None and any(t.frames for t in dump.threads)
        if not readable and rank is None and dump.pid is None and single:
            raise InputError(
                f"{path}: {form}: {dump.error or 'no frame could be read'}; and nothing says which "
                "rank it is (name the file rankN, or pass --rank-from REGEX)"
            )
        captures.append(
            RankCapture(
                pid=dump.pid,
                host=UNKNOWN_HOST,
                rank=rank,
                state=STATE_UNKNOWN if readable else STATE_UNREADABLE,
                threads=dump.threads if readable else (),
                env=Env.of(env),
                error=None if readable else (dump.error or f"{form}: no frame could be read"),
                layout_hints=dict(dump.hints),
                source=path,
            )
        )
    return FileCaptures(path, tuple(captures), notes=tuple(notes), form=form)


def _merge_same_pid(path: str, dumps: list[Dumped], notes: list[str]) -> list[Dumped]:
    by_pid: dict[int, list[int]] = {}
    for i, dump in enumerate(dumps):
        if dump.pid is not None:
            by_pid.setdefault(dump.pid, []).append(i)
    drop: set[int] = set()
    merged: dict[int, Dumped] = {}
    for pid, indexes in by_pid.items():
        if len(indexes) < 2:
            continue
        group = [dumps[i] for i in indexes]
        native = [d for d in group if d.native and d.error is None]
        plain = [d for d in group if not d.native and d.error is None]
        if native and plain:
            kept = _with_args_of(native[-1], plain[-1])
            notes.append(
                f"{path}: pid {pid} has a Python and a native dump; the native one is read (its stack interleaves both)"
            )
        else:
            readable = [d for d in group if d.error is None] or group
            kept = readable[-1]
            notes.append(f"{path}: pid {pid} was dumped {len(group)} times; the last readable dump is read")
        context = tuple(line for d in group for line in d.context)
        merged[indexes[0]] = replace(
            kept, context=context, hints=kept.hints or next((d.hints for d in group if d.hints), ())
        )
        drop.update(indexes[1:])
    return [merged.get(i, d) for i, d in enumerate(dumps) if i not in drop]


def _with_args_of(native: Dumped, plain: Dumped) -> Dumped:
    """The native dump, its Python frames given the kept arguments (dst, src, ...) of the same frames
    in the plain dump (``py-spy dump --locals`` and ``--native`` are often run one after the other)."""
    args = {(t.thread_id, f.function, f.file, f.line): f.args for t in plain.threads for f in t.frames if f.args}
    if not args:
        return native
    threads = []
    for t in native.threads:
        frames = tuple(
            replace(f, args=args.get((t.thread_id, f.function, f.file, f.line), f.args))
            if not f.native and not f.args
            else f
            for f in t.frames
        )
        threads.append(replace(t, frames=frames))
    return replace(native, threads=tuple(threads))


def thread(
    thread_id: int,
    name: str,
    frames: tuple[Frame, ...],
    native_id: int | None = None,
    active: bool | None = None,
    calls: tuple[str, ...] = (),
) -> ThreadStack:
    return ThreadStack(thread_id=thread_id, name=name, frames=frames, native_id=native_id, active=active, calls=calls)


_BOOTSTRAP = ("_bootstrap", "_bootstrap_inner", "Thread._bootstrap", "Thread._bootstrap_inner")


def started_by_threading(frames: tuple[Frame, ...]) -> bool:
    """Whether a stack (innermost first) runs in a thread that ``threading`` started: not a main thread."""
    python = [f for f in frames if not f.native]
    return bool(python) and python[-1].function in _BOOTSTRAP and python[-1].file.endswith("threading.py")


def main_first(threads: list[ThreadStack], current: int | None = None) -> tuple[ThreadStack, ...]:
    """Threads with the main thread first, for dumps that do not say which one it is (faulthandler,
    pystack without a pid): the one ``threading`` did not start; of several, ``current`` (the thread
    that dumped) or else the last printed (both tools print the newest thread first)."""
    candidates = [i for i, t in enumerate(threads) if t.frames and not started_by_threading(t.frames)]
    if not candidates:
        return tuple(threads)
    main = current if current in candidates else candidates[-1]
    return (threads[main], *threads[:main], *threads[main + 1 :])
