"""The fix for verl's MTP/CP deadlock (verl PR #5895): ``engine`` says whether an engine file has it
(``mtpdiag check``), ``rewrite`` fixes it in place and puts it back (``mtpdiag apply``), and ``verify`` proves
a gate safe or shows it hang on real megatron-core (``mtpdiag verify``)."""
