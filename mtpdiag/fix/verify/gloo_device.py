"""One gloo transport device for all the gloo process groups of a CPU world's rank.

torch gives each gloo group a transport device of its own, and gloo's tcp device runs a thread that wakes
every 10 ms (its event loop polls with a 10 ms timeout). megatron-core makes about 20 groups, so a rank of a
CPU world that only waits, hung or between steps, woke 2,000 times a second: 3.3% of a core a rank, 13.5%
for the reproducers' 4-rank hang, and a test suite keeps dozens of such ranks alive at once (torch 2.13,
megatron-core 0.16.1, these 2-core machines; ``/proc/PID/stat`` over 20 s). One device carries the
connections of any number of groups (its listener hands each incoming pair to its group), so the groups,
their collectives, the hang and every Python stack stay the same, with one such thread a rank: 0.4% of a core.
For the CPU worlds we start (``verify`` and the examples), never for a job mtpdiag diagnoses. Imports nothing
but torch, and only when called.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

_LOCK = threading.Lock()
_DEVICES: list[Any] = []  # this process's one device, made by the first group


def share_gloo_device() -> None:
    """Make every gloo group that ``torch.distributed`` creates from now on (``init_process_group``,
    ``new_group``, megatron-core's groups) use this process's one device: call before ``init_process_group``."""
    import torch.distributed.distributed_c10d as c10d

    if not getattr(c10d.ProcessGroupGloo, "_mtpdiag_shared_device", False):
        c10d.ProcessGroupGloo = _shared_device_class(c10d.ProcessGroupGloo)


def gloo_group(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """A ``ProcessGroupGloo`` on this process's one device: for code that builds gloo groups itself."""
    from torch.distributed import ProcessGroupGloo

    return ProcessGroupGloo(store, rank, size, _options(ProcessGroupGloo, timeout))


def _shared_device_class(base: type) -> type:
    """``base`` (torch's ProcessGroupGloo) whose groups are made on this process's one device; a subclass, so
    torch's own ``isinstance`` checks of the groups it creates still hold."""

    class ProcessGroupGlooSharedDevice(base):  # type: ignore[misc]
        _mtpdiag_shared_device = True

        def __init__(self, store: Any, rank: int, size: int, timeout: Any = timedelta(minutes=30)) -> None:
            options = timeout if isinstance(timeout, base._Options) else _options(base, timeout)  # type: ignore[attr-defined]
            if not options._devices:
                options._devices = [_device(base)]
            super().__init__(store, rank, size, options)

    return ProcessGroupGlooSharedDevice


def _options(base: Any, timeout: timedelta) -> Any:
    options = base._Options()
    options._timeout = timeout
    options._devices = [_device(base)]
    return options


def _device(base: Any) -> Any:
    """This process's device, made as torch makes each group's (``create_default_device``) the first time."""
    with _LOCK:
        if not _DEVICES:
            _DEVICES.append(base.create_default_device())
        return _DEVICES[0]
