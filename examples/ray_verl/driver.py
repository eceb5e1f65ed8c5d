"""A Ray job that deploys Megatron workers as verl does, and hangs in verl's MTP + context-parallel bug.

Run like verl's trainer, with Hydra-style overrides for the parallel sizes::

    python examples/ray_verl/driver.py \\
        actor_rollout_ref.actor.megatron.context_parallel_size=2 \\
        actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2

The driver starts a local Ray cluster and, like verl's ``main_ppo``, a ``TaskRunner`` actor that builds
the worker group: ``trainer.n_gpus_per_node`` actors of a class named ``WorkerDict`` (verl's name), each
given ``RANK``, ``WORLD_SIZE``, ``WG_PREFIX``, ``WG_BACKEND``, ``RAY_LOCAL_WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` through ``runtime_env={"env_vars": ...}``, as verl's ``RayWorkerGroup`` does. The
sizes reach the actors as method arguments (verl hands them its config that way), never on their
command lines. Each actor then runs the training step of ``examples/mtp_cp_deadlock/worker.py``: real
megatron-core ``parallel_state`` and ``MTPLossLoggingHelper`` on gloo. With ``--gate buggy`` (verl 0.7.1)
the cp > 0 ranks never join the DP x CP all_reduce and the job hangs; ``--gate fixed`` (verl 0.8.0)
completes.

It prints ``ready pids=RANK:PID,... nodes=... gcs=HOST:PORT coords=...`` once every actor has set up model
parallelism and been sent its training step (``gcs``: the cluster's address, for ``mtpdiag inspect --ray``).
SIGTERM or SIGINT shuts Ray down: the cluster it started (raylet, GCS, workers), or, with ``--address``, its
connection and its actors.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import sys

EXAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MTP_WORKER = os.path.join(EXAMPLES, "mtp_cp_deadlock", "worker.py")
FR_WORKER = os.path.join(EXAMPLES, "flight_recorder", "worker.py")

# The keys of verl's config that this job reads. Sizes default to 1 as in verl; the world to 4 CPU processes.
SIZE_KEYS = {
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "tp",
    "actor_rollout_ref.actor.megatron.context_parallel_size": "cp",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": "pp",
}
DEFAULTS = {"tp": 1, "cp": 1, "pp": 1, "trainer.n_gpus_per_node": 4, "trainer.nnodes": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="verl-style config overrides")
    parser.add_argument("--gate", choices=["buggy", "fixed"], default="buggy",
                        help="buggy: verl 0.7.1's MTP loss gate (hangs with cp > 1); fixed: verl 0.8.0's")
    parser.add_argument("--steps", type=int, default=3, help="training steps before a clean exit")
    parser.add_argument("--address", help="join this running Ray cluster (`ray start --head`) instead of "
                        "starting one")
    parser.add_argument("--temp-dir", help="Ray's session directory root for a cluster of its own "
                        "(default: Ray's /tmp/ray)")
    parser.add_argument("--cluster-utils", action="store_true",
                        help="start the cluster of its own with Ray's ray.cluster_utils.Cluster (its test harness) "
                        "instead of ray.init(); its processes are this driver's children as well")
    parser.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE",
                        help="more env_vars for the workers, as verl's worker_env (e.g. WANDB_API_KEY)")
    args = parser.parse_args(argv)
    config = dict(DEFAULTS)
    for item in args.overrides:
        key, eq, value = item.lstrip("+").partition("=")
        if not eq or not value.isdigit():
            parser.error(f"expected KEY=INTEGER, got {item!r}")
        config[SIZE_KEYS.get(key, key)] = int(value)
    args.sizes = {k: config[k] for k in ("tp", "cp", "pp")}
    args.nnodes = config["trainer.nnodes"]
    args.world_size = config["trainer.n_gpus_per_node"] * args.nnodes
    args.worker_env = dict(item.partition("=")[::2] for item in args.worker_env)
    return args


def free_port() -> int:
    """A free TCP port on the loopback for torch.distributed's rendezvous (verl asks a worker node). Chosen at
    random below the kernel's ephemeral range where there is room: rank 0 binds it only once its actor has started
    (seconds; more on a loaded node), and a port the kernel handed out for port 0 can meanwhile be handed to any
    other bind to port 0 or connection out (gloo's listeners among them), which nothing does below that range."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_from = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_from = 0
    below = range(20000, max(ephemeral_from, 20000))  # 20000: above Ray's worker ports (10002-19999 by default)
    for port in random.sample(below, k=min(32, len(below))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _load(name: str, path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class WorkerDict:
    """One Megatron worker, as verl's fused ``WorkerDict`` actor: rank and rendezvous come from its env."""

    def __init__(self, mtp_worker_path: str) -> None:
        self.mtp = _load("mtp_cp_deadlock_worker", mtp_worker_path)
        prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
        if prefix and os.environ.get("TORCH_FR_BUFFER_SIZE"):
            # The Flight Recorder's dump when the collectives stop, as NCCL's watchdog writes it on its timeout
            # (gloo never does): examples/flight_recorder/worker.py's thread, if the actor was given the variables.
            import threading

            recorder = _load("flight_recorder_worker", FR_WORKER)
            stall_s = float(os.environ.get("MTPDIAG_FR_STALL_S", "5"))
            threading.Thread(target=recorder.watch, args=(prefix, stall_s), name="fr-dump", daemon=True).start()

    def init_model(self, tp: int, cp: int, pp: int) -> tuple[int, int, str, str]:
        """torch.distributed from RANK/WORLD_SIZE/MASTER_* (env://) and megatron-core model parallelism."""
        import ray
        import torch.distributed as dist
        from megatron.core import parallel_state as mpu

        dist.init_process_group("gloo")
        mpu.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                      context_parallel_size=cp)
        coords = (f"tp{mpu.get_tensor_model_parallel_rank()} cp{mpu.get_context_parallel_rank()} "
                  f"dp{mpu.get_data_parallel_rank()} pp{mpu.get_pipeline_model_parallel_rank()}")
        return dist.get_rank(), os.getpid(), ray.get_runtime_context().get_node_id(), coords

    def update_actor(self, gate: str, steps: int) -> list[dict]:
        """The training steps; with the buggy gate the MTP loss reduce never completes."""
        import torch.distributed as dist

        metrics = [self.mtp.train_step(step, gate) for step in range(steps)]
        dist.barrier()
        return metrics


class TaskRunner:
    """verl's ``TaskRunner``: an actor without RANK that builds the worker group and drives it."""

    def init_workers(self, sizes: dict[str, int], world_size: int, worker_env: dict,
                     nnodes: int = 1) -> list[tuple]:
        """Create the worker group and set up model parallelism; (rank, pid, node id, coords) of each worker.

        With ``nnodes`` > 1 the ranks are spread as verl's ``RayResourcePool`` spreads them: one STRICT_PACK
        placement group per node, a ``{"CPU": 1, "GPU": 1}`` bundle per rank (start each node with
        ``--num-gpus``; on CPU the GPUs are only a resource Ray counts), ranks 0.. on the node with the lowest
        address, and so on.
        """
        import uuid

        import ray
        from ray.util.placement_group import placement_group, placement_group_table
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        prefix = uuid.uuid4().hex[:6]  # verl: a random 6-character name prefix
        master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        actor_class = ray.remote(num_cpus=1)(WorkerDict)
        per_node = world_size // nnodes
        pools = []
        if nnodes > 1:
            pools = [placement_group([{"CPU": 1, "GPU": 1}] * per_node, strategy="STRICT_PACK")
                     for _ in range(nnodes)]
            ray.get([pg.ready() for pg in pools])
            # Ranks go node by node in the order of the nodes' addresses, as verl orders its placement groups.
            address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
            pools.sort(key=lambda pg: address[placement_group_table(pg)["bundles_to_node_id"][0]])
        self.workers = []
        for rank in range(world_size):
            local = rank % per_node
            env_vars = {"WORLD_SIZE": str(world_size), "RANK": str(rank), "WG_PREFIX": prefix,
                        "WG_BACKEND": "ray", "RAY_LOCAL_WORLD_SIZE": str(per_node),
                        "RAY_LOCAL_RANK": str(local), **master, "OMP_NUM_THREADS": "1", **worker_env}
            options: dict = {"name": f"{prefix}WorkerDict_{rank // per_node}:{local}",
                             "runtime_env": {"env_vars": env_vars}}
            if pools:
                options["num_gpus"] = 1
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    pools[rank // per_node], placement_group_bundle_index=local)
            self.workers.append(actor_class.options(**options).remote(MTP_WORKER))
        return sorted(ray.get([w.init_model.remote(**sizes) for w in self.workers]))

    def fit(self, gate: str, steps: int) -> list:
        """Every rank's steps. It waits for all of them before it reads any: a rank lost with its node leaves
        the others hanging in their collectives, as NCCL ranks hang until their watchdog fires, rather than
        ending the job at once (``ray.get`` of a list raises as soon as one of them failed)."""
        import ray

        refs = [w.update_actor.remote(gate, steps) for w in self.workers]
        ray.wait(refs, num_returns=len(refs))
        return ray.get(refs)


def _stop(signum, _frame):
    raise SystemExit(128 + signum)


def prepare_cluster_utils(temp_dir: str | None) -> None:
    """What ``ray.cluster_utils.Cluster`` needs before Ray is imported, for a head on the loopback.

    It writes the head's address to ``$RAY_TMPDIR/ray/ray_current_cluster`` (default ``/tmp/ray/``) without
    creating the directory, so the temp dir becomes ``RAY_TMPDIR`` and its ``ray/`` is made first; and
    ``ray.init(address=...)`` rewrites a 127.0.0.1 address to the host's, where a loopback head does not listen,
    unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps Ray on this one machine.
    """
    if temp_dir:
        os.environ["RAY_TMPDIR"] = temp_dir
    os.makedirs(os.path.join(os.environ.get("RAY_TMPDIR") or "/tmp", "ray"), exist_ok=True)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.cluster_utils:
        prepare_cluster_utils(args.temp_dir)
    import ray

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    cluster = None
    try:
        if args.cluster_utils:  # Ray's test harness: the head node's processes are this driver's children
            from ray.cluster_utils import Cluster

            cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": args.world_size + 1, "include_dashboard": False, "node_ip_address": "127.0.0.1"})
            ray.init(address=cluster.address)
        elif args.address or os.environ.get("RAY_ADDRESS"):  # a running cluster: `ray start`, `ray job submit`
            ray.init(address=args.address or os.environ["RAY_ADDRESS"])
        else:
            ray.init(num_cpus=args.world_size + 1, include_dashboard=False, _node_ip_address="127.0.0.1",
                     _temp_dir=args.temp_dir)
        runner = ray.remote(num_cpus=1)(TaskRunner).remote()
        placed = ray.get(runner.init_workers.remote(args.sizes, args.world_size, args.worker_env, args.nnodes))
        training = runner.fit.remote(args.gate, args.steps)
        print("ready pids=" + ",".join(f"{rank}:{pid}" for rank, pid, _, _ in placed)
              + " nodes=" + ",".join(f"{rank}:{node}" for rank, _, node, _ in placed)
              + " gcs=" + ray.get_runtime_context().gcs_address
              + " coords=" + "; ".join(coords for _, _, _, coords in placed), flush=True)
        print(f"done metrics={ray.get(training)}", flush=True)
        return 0
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
