"""``mtpdiag lint``: a static finder of collectives that only some ranks can reach.

A collective hangs when part of its process group skips it. In source code that shows up as a
collective (a ``torch.distributed`` call, or a function known to run one) under a condition that
depends on the rank. The condition is harmless when the coordinate it tests is constant across the
collective's group -- a pipeline-stage test around a DP×CP all_reduce splits nothing, because every
member of a DP×CP group sits on the same stage. This package applies that rule with the group kinds of
``mtpdiag.layout``, and ``mtpdiag check`` reuses its guard analysis for verl's MTP block.

Which functions run a collective, and on which group, comes from the known-site table
(``mtpdiag.analysis.known_sites``): a call is matched by its qualified name
(``MTPLossLoggingHelper.reduce_metrics_in_tracker``), never by its short name alone, and inside a
function of the table a ``group=tracker["avg_group"]`` is the group the table says fills that slot.
A test of whether a metric tracker holds something is a pipeline-stage test: a layer-wise tracker is
filled only by the layers a rank holds, so it is empty on the stages without them (Megatron-LM #4745).

Everything here is pure ``ast`` work except ``lint_paths``, the one edge that reads files.

* ``guards``: every collective call and the conditions on the way to it;
* ``rank_tests``: which parts of a condition depend on the rank, and on which coordinates;
* ``groups``: which coordinates vary inside a collective's group;
* ``rules``: the judgement, one ``LintFinding`` per collective part of its group can skip;
* ``names``: dotted names and source text; ``files``: the walk over paths.
"""

from mtpdiag.lint.files import iter_python_files, lint_paths
from mtpdiag.lint.groups import ANY, EVERY_COORD, group_coords, kinds_coords, splits
from mtpdiag.lint.guards import Guard, GuardedCall, guarded_calls
from mtpdiag.lint.names import call_name, dotted_name, import_aliases, source_text
from mtpdiag.lint.rank_tests import RANK_FREE_CALLS, TRACKER_WHY, RankTest, rank_tests, unclassified_calls
from mtpdiag.lint.rules import SCHEMA, LintFinding, LintResult, collectives_by_function, guard_text, lint_source

__all__ = [
    "ANY",
    "EVERY_COORD",
    "RANK_FREE_CALLS",
    "SCHEMA",
    "TRACKER_WHY",
    "Guard",
    "GuardedCall",
    "LintFinding",
    "LintResult",
    "RankTest",
    "call_name",
    "collectives_by_function",
    "dotted_name",
    "group_coords",
    "guard_text",
    "guarded_calls",
    "import_aliases",
    "iter_python_files",
    "kinds_coords",
    "lint_paths",
    "lint_source",
    "rank_tests",
    "source_text",
    "splits",
    "unclassified_calls",
]
