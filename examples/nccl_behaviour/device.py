"""The emulated GPU of the NCCL-behaviour reproducer: one in-order stream per rank, and host syncs in C.

On a GPU, the host queues collectives and kernels on a CUDA stream and goes on; it blocks only at a host
sync (``.item()``, ``.cpu()``, ``.tolist()``, ``torch.cuda.synchronize()``), which waits until the
stream has run everything queued before it. Here the stream is a Python thread that runs queued items
in order, and a host sync is a call into ``hostsync.c`` (built with the system C compiler on first use
and cached): it blocks in C, so py-spy's innermost Python frame is the line that issued the sync.

``on_device(tensor)`` makes a CPU tensor behave like a CUDA tensor for reading: its ``cpu``, ``item``
and ``tolist`` become C calls that wait for the stream first. The tensor stays a real torch tensor.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().with_name("hostsync.c")
SYNC_MODES = ("spin", "poll", "futex")


def shim_cache() -> Path:
    """Where the compiled shim lives: ``$MTPDIAG_SHIM_CACHE``, else ``$XDG_CACHE_HOME/mtpdiag`` or ``~/.cache/mtpdiag``."""
    explicit = os.environ.get("MTPDIAG_SHIM_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mtpdiag"


def load_shim() -> ctypes.CDLL:
    """Compile ``hostsync.c`` once per content (concurrent ranks race harmlessly: the first build is kept)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    cache = shim_cache()
    lib = cache / f"hostsync-{digest}.so"
    if not lib.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".hostsync-{digest}.{os.getpid()}.so"
        cc = os.environ.get("CC", "gcc")
        done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"could not build {SOURCE.name} with {cc}: {done.stderr.strip()}")
        _publish(tmp, lib)
    shim = ctypes.CDLL(str(lib))
    shim.stream_issue.restype = ctypes.c_uint32
    shim.stream_issued.restype = ctypes.c_uint32
    shim.stream_completed.restype = ctypes.c_uint32
    return shim


class Stream:
    """One in-order device stream: ``launch`` queues an item and returns at once; a thread runs the items.

    An item that raises stalls the stream for good, as a faulted kernel would; the error goes to stderr.
    """

    def __init__(self, sync: str = "spin"):
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, not {sync!r}")
        self.sync = sync
        self._shim = load_shim()
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._wait_for = {kind: self._host_wait(kind) for kind in ("cpu", "item", "tolist")}
        self._thread = threading.Thread(target=self._run, name="emulated-cuda-stream", daemon=True)
        self._thread.start()

    def _host_wait(self, kind: str):
        """A fresh ctypes function object for host_wait_<mode>, whose errcheck returns what the call reads.

        errcheck runs after the C wait has returned, so while the host waits no Python frame of ours exists.
        """
        func = ctypes.CFUNCTYPE(None, ctypes.py_object)((f"host_wait_{self.sync}", self._shim))
        read = {"cpu": lambda t: t, "item": torch.Tensor.item, "tolist": torch.Tensor.tolist}[kind]
        func.errcheck = lambda _result, _func, args: read(args[0])
        return func

    def launch(self, run: Callable[[], None], on_done: Callable[[], None] | None = None) -> None:
        """Queue ``run`` on the stream; ``on_done`` runs on the stream right after it."""
        self._shim.stream_issue()
        self._items.put((run, on_done))

    def kernel(self, seconds: float) -> None:
        """A compute kernel that keeps the device busy for ``seconds``."""
        if seconds > 0:
            self.launch(functools.partial(time.sleep, seconds))

    def on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """Give ``tensor`` a CUDA tensor's reads: ``cpu()``, ``item()`` and ``tolist()`` wait for the stream;
        and its in-place ``zero_()``/``fill_()`` run on the stream, after the collectives queued before them."""
        for kind, wait in self._wait_for.items():
            setattr(tensor, kind, functools.partial(wait, tensor))
        for name in ("zero_", "fill_"):
            setattr(tensor, name, functools.partial(self._queued, getattr(torch.Tensor, name), tensor))
        return tensor

    def _queued(self, method, tensor: torch.Tensor, *args) -> torch.Tensor:
        self.launch(functools.partial(method, tensor, *args))
        return tensor

    def pending(self) -> int:
        return (self._shim.stream_issued() - self._shim.stream_completed()) & 0xFFFFFFFF

    def _run(self) -> None:
        while (item := self._items.get()) is not None:
            run, on_done = item
            try:
                run()
                if on_done is not None:
                    on_done()
            except BaseException:  # noqa: BLE001 - a faulted kernel: report it and never complete again
                print(f"emulated device stream stalled by an error:\n{traceback.format_exc()}", file=sys.stderr,
                      flush=True)
                threading.Event().wait()
            self._shim.stream_complete()

    def close(self) -> None:
        """Let the queued items run, then end the stream's thread (before the process groups are destroyed)."""
        self._items.put(None)
        self._thread.join()


_STREAM: Stream | None = None


def close_stream() -> None:
    """End the process's stream, if one was created."""
    global _STREAM
    if _STREAM is not None:
        _STREAM.close()
        _STREAM = None


def current_stream(sync: str | None = None) -> Stream:
    """The process's one stream (the shim's counters are per process), created on first use."""
    global _STREAM
    if _STREAM is None:
        _STREAM = Stream(sync or os.environ.get("MTPDIAG_HOST_SYNC", "spin"))
    return _STREAM


def _publish(build: Path, lib: Path) -> None:
    """Put ``build`` at ``lib`` unless another rank's build is there already, and never replace one.

    A rank that loaded the earlier build keeps it mapped: replacing the file under it leaves the mapping
    "(deleted)", and py-spy --native then shows that rank's host sync as a bare address instead of its name.
    (Defined last in the file: the lines above are recorded in tests/fixtures.)
    """
    try:
        os.link(build, lib)
    except FileExistsError:
        pass
    finally:
        build.unlink()



def report_step(rank: int, step: int, metrics: object, pause_at_step: int | None, pause_s: float) -> None:
    """The step's progress line; after step ``pause_at_step``, a checkpoint write's stand-in: every rank leaves the
    collectives for ``pause_s`` (no collective runs, no main thread moves), as while each writes its shard to slow
    storage. (Here, at the end of this module, so that no line the recorded fixtures quote moves.)"""
    print(f"rank {rank} step {step} {metrics}", flush=True)
    if step == pause_at_step:
        print(f"rank {rank} checkpoint pause of {pause_s:g} s", flush=True)
        time.sleep(pause_s)
