"""One definition of each fact the pipeline stages share, so that they cannot drift apart.

* ``states``: the words of the report contracts as ``StrEnum``s (rank states, verdicts, roles, sources,
  finding ids, verify outcomes); each member *is* its JSON string.
* ``waits``: wait kinds, how sure a reading is, and what a source line's calls say about a wait.
* ``ops``: torch.distributed's op names: which are point-to-point, barriers, world-group calls, and how the
  Flight Recorder and the NCCL watchdog spell them; ``profiling_names``: the recorder's profiling names
  (``nccl:send 0->1``) read into those ops, and the op a batch of them stands for.
* ``groups``: the coordinates, group kinds' display names, and megatron's group descriptions.
* ``sizes``: the parallel sizes in their flag, hydra and config spellings.
* ``stacks``: which frames of a stack are torch, plumbing or the stdlib, and which one is the call site.
* ``labels``: the one formatter of rank lists and the one of coordinates (``tp0 cp1 pp1``).

Nothing here imports the rest of mtpdiag.
"""
