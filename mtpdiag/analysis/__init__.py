"""Pure analysis: a Snapshot (and an optional layout) in, a Report out. No I/O, no torch.

``classify`` reads each rank's stack, ``wait`` what a rank in no collective waits on, ``views`` makes each
rank's view (each distinct stack read once), ``sites`` groups the
ranks, ``mismatch`` finds the split group instances and ``gate`` the coordinate that splits them, ``causes``
tells the root from its consequences, ``flight_recorder`` and ``log_evidence`` fold in the recorder's dumps
and the watchdog's lines, ``findings`` names the problems (a registry of rules) and ``diagnose`` runs it all.
``known_sites`` is the table of call sites whose group is known; ``stall`` is ``watch``'s stall detector.
"""

from mtpdiag.analysis.diagnose import diagnose

__all__ = ["diagnose"]
