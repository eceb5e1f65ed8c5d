"""The MTP-CP reproducer, plus a Flight Recorder dump written when its collectives stop making progress.

torch 2.13 records gloo collectives in the Flight Recorder (``TORCH_FR_BUFFER_SIZE=N``) but, unlike NCCL,
never writes the record on a timeout. This wrapper runs ``examples/mtp_cp_deadlock/worker.py`` unchanged
and starts a daemon thread that polls the recorder's per-group progress (``pg_status``). When it has not
moved for ``MTPDIAG_FR_STALL_S`` seconds (default 5), the thread writes torch's own pickle to
``${TORCH_FR_DUMP_TEMP_FILE}<rank>``, the name torch uses for NCCL dumps.

torch 2.13's gloo backend also files every group under an empty name in ``pg_config``, so the thread adds
each group's name, description and global ranks from ``torch.distributed`` in the format NCCL dumps use
(``{"name": ..., "desc": ..., "ranks": "[2, 3]"}``). Everything else is torch's dump as is.

    TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_TEMP_FILE=/tmp/fr/rank_ \\
        torchrun --standalone --nproc-per-node 4 examples/flight_recorder/worker.py --gate buggy --cp 2 --pp 2
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import sys
import threading
import time
from pathlib import Path

REPRODUCER = Path(__file__).resolve().parent.parent / "mtp_cp_deadlock" / "worker.py"
POLL_S = 0.5


def group_configs() -> dict:
    """Every process group this rank knows, keyed by group name, as NCCL's pg_config spells them."""
    from torch.distributed import distributed_c10d as c10d

    out = {}
    for pg, name in list(c10d._world.pg_names.items()):
        ranks = sorted(c10d._world.pg_group_ranks.get(pg, {}))
        out[name] = {"name": name, "desc": pg.group_desc, "ranks": json.dumps(ranks)}
    return out


def write_dump(path: str) -> None:
    """Write torch's Flight Recorder pickle, with the group membership gloo leaves out, atomically."""
    from torch._C._distributed_c10d import _dump_fr_trace

    dump = pickle.loads(_dump_fr_trace())
    config = {name: cfg for name, cfg in dump.get("pg_config", {}).items() if name}
    for name, cfg in group_configs().items():
        config.setdefault(name, cfg)
    dump["pg_config"] = config
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(dump, f)
    os.replace(tmp, path)


def progress() -> str:
    """The recorder's per-group enqueued/started/completed sequence ids: it moves while collectives do."""
    from torch._C._distributed_c10d import _dump_fr_trace_json

    return json.dumps(json.loads(_dump_fr_trace_json(includeCollectives=False)).get("pg_status"), sort_keys=True)


def watch(prefix: str, stall_s: float) -> None:
    """Dump once per stall: when progress has not changed for ``stall_s`` seconds."""
    import torch.distributed as dist

    while not dist.is_initialized():
        time.sleep(POLL_S)
    path = f"{prefix}{dist.get_rank()}"
    last, since, dumped = None, time.monotonic(), False
    while True:
        time.sleep(POLL_S)
        now = progress()
        if now != last:
            last, since, dumped = now, time.monotonic(), False
        elif not dumped and time.monotonic() - since >= stall_s:
            write_dump(path)
            dumped = True


def load_reproducer():
    spec = importlib.util.spec_from_file_location("mtp_cp_deadlock_worker", REPRODUCER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if not prefix or not os.environ.get("TORCH_FR_BUFFER_SIZE"):
        sys.exit("set TORCH_FR_BUFFER_SIZE and TORCH_FR_DUMP_TEMP_FILE to record and dump the Flight Recorder")
    stall_s = float(os.environ.get("MTPDIAG_FR_STALL_S", "5"))
    threading.Thread(target=watch, args=(prefix, stall_s), name="fr-dump", daemon=True).start()
    return load_reproducer().main(argv)


if __name__ == "__main__":
    sys.exit(main())
