"""A Ray driver that joins the cluster at ``argv[1]`` and prints what a nested actor's environment holds.

As verl's workers are made: the driver's ``ray.init`` gives a runtime_env of its own (``DRIVER_RT``), a
``Runner`` actor creates an ``Inner`` actor with env_vars of its own (``OWN``, as verl's RANK, WORLD_SIZE, ...),
and the inner one reports the keys named in ``argv[2:]``. ``PROBE_DRIVER_SETS=KEY=VALUE`` adds a variable to the
driver's own runtime_env (a key its code sets itself). Prints ``PROBE {json}`` and exits 0.
"""

import json
import os
import sys

import ray


@ray.remote(num_cpus=0)
class Inner:
    def env(self, keys):
        return {k: os.environ.get(k) for k in keys}


@ray.remote(num_cpus=0)
class Runner:
    def run(self, keys):
        inner = Inner.options(runtime_env={"env_vars": {"OWN": "own"}}).remote()
        return ray.get(inner.env.remote(keys))


if __name__ == "__main__":
    own = {"DRIVER_RT": "driver"}
    key, _, value = os.environ.get("PROBE_DRIVER_SETS", "").partition("=")
    own.update({key: value} if key else {})
    ray.init(address=sys.argv[1], runtime_env={"env_vars": own})
    print("PROBE " + json.dumps(ray.get(Runner.remote().run.remote(sys.argv[2:]))), flush=True)
    ray.shutdown()
