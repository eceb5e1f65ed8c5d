"""How ``mtpdiag run`` gave a Ray job's actors the Flight Recorder's variables (``run.json``'s ``ray.route``)."""

from __future__ import annotations

from mtpdiag.vocabulary.states import StrEnum


class RayEnvRoute(StrEnum):
    """The way the variables reach the actors: Ray starts each actor from its node's raylet, with the raylet's
    environment and the job's ``runtime_env``, never with the driver's environment (unless the driver started
    that raylet itself)."""

    # ``ray job submit --runtime-env-json``: the job's runtime_env, merged into the user's own
    SUBMIT_RUNTIME_ENV = "ray job submit --runtime-env-json"
    # the variable through which Ray's job supervisor hands a job's runtime_env to its driver; the driver's
    # ray.init merges it with its own
    JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
    # nothing could be applied (said why): the actors get the variables only if the user gives them
    NOT_APPLIED = "not applied"
