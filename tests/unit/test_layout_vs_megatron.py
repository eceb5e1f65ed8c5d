"""``ParallelLayout`` against megatron-core itself.

Every analysis in mtpdiag stands on ``layout.py`` knowing which ranks share a process group, so it is
checked against megatron-core two ways:

* arithmetic: for layouts up to 64 ranks, ``groups(kind)`` and ``coords(rank)`` against megatron's own
  ``RankGenerator.get_ranks`` called exactly as ``initialize_model_parallel`` calls it (the decoder
  generator with ep=1 for dense kinds, the expert generator with tp=etp and cp=1 for expert kinds), and
  the layouts megatron refuses must be refused too;
* runtime: a few layouts through the real ``initialize_model_parallel`` on a gloo world, where every rank
  reports ``get_*_rank()`` and the ranks of each ``get_*_group()``.

Only this test imports megatron; ``mtpdiag.layout`` must not.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass
from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpdiag.fix.verify.lazy_compile import defer_torch_compile
from mtpdiag.layout import DEFAULT_ORDER, GROUP_KINDS, LayoutError, ParallelLayout

# Every xdist worker of the unit tier collects this module: megatron's 24 torch.compile decorations would cost each
# ~2 CPU-s of its ~4.7 (torch 2.13), and no test here calls a compiled kernel.
defer_torch_compile()
with warnings.catch_warnings():  # megatron warns about missing Transformer Engine / Apex on import
    warnings.simplefilter("ignore")
    parallel_state = pytest.importorskip(
        "megatron.core.parallel_state", reason="needs megatron-core (pip install -e .[verify])"
    )

RankGenerator = parallel_state.RankGenerator

TOKENS = ("tp", "cp", "ep", "dp", "pp")
PP_LAST_FREE_ORDER = "tp-cp-ep-pp-dp"  # Megatron-LM's --use-tp-pp-dp-mapping

# How initialize_model_parallel builds each group (megatron/core/parallel_state.py): which generator and
# which get_ranks token. Written out here, not taken from layout.GROUP_KINDS, so that a wrong entry there
# cannot agree with itself. "world" is torch's default group: every rank, in order.
MEGATRON_BUILDS = {
    "tp": ("decoder", "tp"),
    "cp": ("decoder", "cp"),
    "dp": ("decoder", "dp"),
    "pp": ("decoder", "pp"),
    "dp_cp": ("decoder", "dp-cp"),
    "tp_cp": ("decoder", "tp-cp"),
    "tp_dp": ("decoder", "tp-dp"),
    "tp_dp_cp": ("decoder", "tp-dp-cp"),
    "mp": ("decoder", "tp-pp"),
    "world": None,
    "ep": ("expert", "ep"),
    "etp": ("expert", "tp"),
    "edp": ("expert", "dp"),
    "tp_ep": ("expert", "tp-ep"),
    "tp_ep_pp": ("expert", "tp-ep-pp"),
}

# coordinate -> the group kind whose member index megatron's get_*_rank() returns.
COORD_GROUPS = {"tp": "tp", "cp": "cp", "ep": "ep", "dp": "dp", "pp": "pp"}


@dataclass(frozen=True)
class Case:
    """One input to ``ParallelLayout.for_world`` and, equally, to ``initialize_model_parallel``."""

    world: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int | None = None
    order: str = DEFAULT_ORDER

    def layout(self) -> ParallelLayout:
        return ParallelLayout.for_world(
            self.world, tp=self.tp, cp=self.cp, pp=self.pp, ep=self.ep, etp=self.etp, order=self.order
        )


@lru_cache(maxsize=4096)
def _generator_ranks(tp: int, ep: int, dp: int, pp: int, cp: int, order: str, token: str):
    ranks = RankGenerator(tp=tp, ep=ep, dp=dp, pp=pp, cp=cp, order=order).get_ranks(token)
    return [tuple(group) for group in ranks]


def megatron_groups(case: Case) -> dict[str, list[tuple[int, ...]]] | None:
    """Every group kind as initialize_model_parallel computes it; None where megatron refuses the layout.

    The checks and their order are initialize_model_parallel's (megatron-core 0.16): world divisible by
    tp*pp*cp, both RankGenerators constructible, world divisible by etp*ep*pp, pp last in the order
    unless pp == 1 or the expert dp equals dp, and identical pp groups from both generators.
    """
    if case.world % (case.tp * case.pp * case.cp):
        return None
    dp = case.world // (case.tp * case.pp * case.cp)
    etp = case.tp if case.etp is None else case.etp
    edp = case.world // (etp * case.ep * case.pp)
    decoder = (case.tp, 1, dp, case.pp, case.cp, case.order)
    expert = (etp, case.ep, edp, case.pp, 1, case.order)
    try:
        decoder_pp = _generator_ranks(*decoder, "pp")
        if case.world % (etp * case.ep * case.pp):
            return None
        expert_pp = _generator_ranks(*expert, "pp")
    except (RuntimeError, KeyError, ValueError):  # a token missing from the order, or not a token
        return None
    if not (case.order.endswith("pp") or case.pp == 1 or edp == dp):
        return None
    if decoder_pp != expert_pp:
        return None
    out = {}
    for kind, build in MEGATRON_BUILDS.items():
        if build is None:
            out[kind] = [tuple(range(case.world))]
        else:
            generator, token = build
            out[kind] = _generator_ranks(*(decoder if generator == "decoder" else expert), token)
    return out


def megatron_coords(groups: dict[str, list[tuple[int, ...]]]) -> dict[int, dict[str, int]]:
    """get_*_rank() of every rank: its index in its group, whose members torch's new_group sorts."""
    out: dict[int, dict[str, int]] = {}
    for coord, kind in COORD_GROUPS.items():
        for group in groups[kind]:
            for index, rank in enumerate(sorted(group)):
                out.setdefault(rank, {})[coord] = index
    return out


def check_against_megatron(case: Case) -> bool:
    """Assert that layout.py and megatron agree on ``case``; True if megatron accepts it."""
    expected = megatron_groups(case)
    if expected is None:
        with pytest.raises(LayoutError):
            case.layout()
        return False
    layout = case.layout()
    assert layout.world_size == case.world
    for kind in GROUP_KINDS:
        assert layout.groups(kind) == expected[kind], f"{case}: {kind} groups differ from megatron"
    coords = megatron_coords(expected)
    for rank in range(case.world):
        assert layout.coords(rank) == coords[rank], f"{case}: coords of rank {rank}"
    return True


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def size_cases(max_world: int, etp_values: str = "none", order: str = DEFAULT_ORDER):
    """Every (world, tp, cp, pp, ep[, etp]) with world <= max_world; dp is what is left.

    ``etp_values``: "none" (etp unset, i.e. = tp) or "all" (also every etp that divides the world).
    """
    for world in range(1, max_world + 1):
        for tp in _divisors(world):
            for cp in _divisors(world // tp):
                for pp in _divisors(world // (tp * cp)):
                    etps = [None] + (_divisors(world // pp) if etp_values == "all" else [])
                    for etp in etps:
                        for ep in _divisors(world // (pp * (etp or tp))):
                            yield Case(world, tp, cp, pp, ep, etp, order)


def orders_for(case: Case):
    """Every order that gives megatron a different layout for ``case``, each spelled as megatron takes it.

    Only the tokens whose size is above 1 (in either generator) change the groups, so their permutations
    are enumerated. The size-1 tokens are put in at rotating places, or left out (megatron appends the
    missing ones), so that layout.py's handling of them is exercised too.
    """
    etp = case.etp or case.tp
    world_dp = case.world // (case.tp * case.cp * case.pp)
    expert_dp = case.world // (etp * case.ep * case.pp)
    sizes = {"tp": max(case.tp, etp), "cp": case.cp, "ep": case.ep, "dp": max(world_dp, expert_dp), "pp": case.pp}
    active = [t for t in TOKENS if sizes[t] > 1]
    idle = [t for t in TOKENS if sizes[t] == 1]
    for index, perm in enumerate(itertools.permutations(active)):
        tokens = list(perm)
        if index % 3 != 2 or not tokens:  # every third order leaves the size-1 tokens out
            for offset, token in enumerate(idle):
                tokens.insert((index + offset) % (len(tokens) + 1), token)
        yield "-".join(tokens)


def test_megatron_build_table_covers_every_group_kind():
    assert set(MEGATRON_BUILDS) == set(GROUP_KINDS)


def test_every_size_up_to_64_ranks_default_order():
    """All 6036 (world, tp, cp, pp, ep) layouts of up to 64 ranks in megatron's default order."""
    cases = list(size_cases(64))
    accepted = sum(check_against_megatron(c) for c in cases)
    assert accepted == len(cases) == 6036  # the default order puts pp last: megatron refuses none


def test_every_size_up_to_32_ranks_pp_before_dp():
    """Megatron-LM's --use-tp-pp-dp-mapping order, which megatron allows only where edp == dp."""
    cases = list(size_cases(32, order=PP_LAST_FREE_ORDER))
    accepted = sum(check_against_megatron(c) for c in cases)
    assert 0 < accepted < len(cases)


def test_every_expert_tensor_parallel_size_up_to_16_ranks():
    cases = [c for c in size_cases(16, etp_values="all") if c.etp is not None]
    assert len(cases) > 1000
    assert all(check_against_megatron(c) for c in cases)


def test_every_order_up_to_16_ranks():
    """Every permutation of the tokens that matter, for every size up to 16 ranks (etp unset)."""
    checked = accepted = 0
    for case in size_cases(16):
        for order in orders_for(case):
            accepted += check_against_megatron(Case(case.world, case.tp, case.cp, case.pp, case.ep, case.etp, order))
            checked += 1
    assert checked > 3000 and 0 < accepted < checked


def test_every_order_and_etp_up_to_8_ranks():
    checked = 0
    for case in size_cases(8, etp_values="all"):
        for order in orders_for(case):
            check_against_megatron(Case(case.world, case.tp, case.cp, case.pp, case.ep, case.etp, order))
            checked += 1
    assert checked > 2000


@st.composite
def any_case(draw) -> Case:
    """Any layout of up to 64 ranks, any order of the five tokens, any etp."""
    world = draw(st.integers(1, 64))
    tp = draw(st.sampled_from(_divisors(world)))
    cp = draw(st.sampled_from(_divisors(world // tp)))
    pp = draw(st.sampled_from(_divisors(world // (tp * cp))))
    etp = draw(st.none() | st.sampled_from(_divisors(world // pp)))
    ep = draw(st.sampled_from(_divisors(world // (pp * (etp or tp)))))
    order = "-".join(draw(st.permutations(TOKENS)))
    return Case(world, tp, cp, pp, ep, etp, order)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(any_case())
def test_random_layouts_any_order_up_to_64_ranks(case):
    check_against_megatron(case)


@pytest.mark.parametrize(
    "case",
    [
        Case(4, cp=2, pp=2, order="tp-cp-ep-pp-dp"),  # pp not last, edp 2 != dp 1
        Case(8, tp=2, pp=2, ep=2, etp=1, order="tp-pp-ep-cp-dp"),  # pp groups differ between generators
        Case(4, cp=2, pp=2, order="TP-CP-EP-DP-PP"),  # megatron's pp-last test is case-sensitive
        Case(4, pp=2, order="tp-cp-ep-dp"),  # pp > 1 missing from the order
        Case(4, ep=2, order="tp-cp-dp-pp"),  # ep > 1 missing from the order
        Case(4, tp=3),  # tp does not divide the world
        Case(4, tp=2, ep=4),  # etp*ep*pp does not divide the world
    ],
)
def test_layouts_megatron_refuses_are_refused(case):
    assert megatron_groups(case) is None
    with pytest.raises(LayoutError):
        case.layout()


def test_layout_module_does_not_import_megatron_or_torch():
    code = (
        "import sys, mtpdiag.layout; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- the real initialize_model_parallel on a gloo world -----------------------------------------------

# (name, kwargs of initialize_model_parallel); run in this order on one world per size.
REAL_CASES = {
    4: [
        ("cp2-pp2", dict(context_parallel_size=2, pipeline_model_parallel_size=2)),
        (
            "tp2-pp2-ep2-etp1",
            dict(
                tensor_model_parallel_size=2,
                pipeline_model_parallel_size=2,
                expert_model_parallel_size=2,
                expert_tensor_parallel_size=1,
            ),
        ),
        ("cp2-ep2-dp2", dict(context_parallel_size=2, expert_model_parallel_size=2)),
        ("pp2-dp2-pp-before-dp", dict(pipeline_model_parallel_size=2, order=PP_LAST_FREE_ORDER)),
        (
            "cp2-pp2-pp-before-dp",
            dict(context_parallel_size=2, pipeline_model_parallel_size=2, order=PP_LAST_FREE_ORDER),
        ),  # refused: edp 2 != dp 1
    ],
    8: [
        ("tp2-cp2-pp2", dict(tensor_model_parallel_size=2, context_parallel_size=2, pipeline_model_parallel_size=2)),
        (
            "cp2-pp2-ep4-etp1",
            dict(
                context_parallel_size=2,
                pipeline_model_parallel_size=2,
                expert_model_parallel_size=4,
                expert_tensor_parallel_size=1,
            ),
        ),
        (
            "tp2-cp2-pp2-ep2-pp-before-dp",
            dict(
                tensor_model_parallel_size=2,
                context_parallel_size=2,
                pipeline_model_parallel_size=2,
                expert_model_parallel_size=2,
                order=PP_LAST_FREE_ORDER,
            ),
        ),
        (
            "cp2-pp2-ep2-pp-first",
            dict(
                context_parallel_size=2,
                pipeline_model_parallel_size=2,
                expert_model_parallel_size=2,
                order="pp-tp-cp-ep-dp",
            ),
        ),
        (
            "pp2-ep2-pp-first",
            dict(pipeline_model_parallel_size=2, expert_model_parallel_size=2, order="pp-tp-cp-ep-dp"),
        ),  # refused: edp 2 != dp 4
    ],
}


def _case_of(world: int, kwargs: dict) -> Case:
    return Case(
        world,
        tp=kwargs.get("tensor_model_parallel_size", 1),
        cp=kwargs.get("context_parallel_size", 1),
        pp=kwargs.get("pipeline_model_parallel_size", 1),
        ep=kwargs.get("expert_model_parallel_size", 1),
        etp=kwargs.get("expert_tensor_parallel_size"),
        order=kwargs.get("order", DEFAULT_ORDER),
    )


def _report_rank(rank: int, world: int, store_path: str, out_dir: str) -> None:
    """A gloo rank: run each REAL_CASES layout through initialize_model_parallel and write what it sees."""
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    mpu = parallel_state
    getters = {
        "tp": mpu.get_tensor_model_parallel_group,
        "cp": mpu.get_context_parallel_group,
        "dp": mpu.get_data_parallel_group,
        "pp": mpu.get_pipeline_model_parallel_group,
        "dp_cp": lambda: mpu.get_data_parallel_group(with_context_parallel=True),
        "tp_cp": mpu.get_tensor_and_context_parallel_group,
        "tp_dp": mpu.get_tensor_and_data_parallel_group,
        "tp_dp_cp": lambda: mpu.get_tensor_and_data_parallel_group(with_context_parallel=True),
        "mp": mpu.get_model_parallel_group,
        "world": lambda: dist.group.WORLD,
        "ep": mpu.get_expert_model_parallel_group,
        "etp": mpu.get_expert_tensor_parallel_group,
        "edp": mpu.get_expert_data_parallel_group,
        "tp_ep": mpu.get_expert_tensor_and_model_parallel_group,
        "tp_ep_pp": mpu.get_expert_tensor_model_pipeline_parallel_group,
    }
    report = {}
    for name, kwargs in REAL_CASES[world]:
        try:
            mpu.initialize_model_parallel(create_gloo_process_groups=False, **kwargs)
        except (AssertionError, RuntimeError) as exc:
            report[name] = {"refused": f"{type(exc).__name__}: {exc}"}
            mpu.destroy_model_parallel()
            continue
        report[name] = {
            "groups": {kind: dist.get_process_group_ranks(get()) for kind, get in getters.items()},
            "coords": {
                "tp": mpu.get_tensor_model_parallel_rank(),
                "cp": mpu.get_context_parallel_rank(),
                "ep": mpu.get_expert_model_parallel_rank(),
                "dp": mpu.get_data_parallel_rank(),
                "pp": mpu.get_pipeline_model_parallel_rank(),
            },
        }
        dist.barrier()
        mpu.destroy_model_parallel()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


def _run_world(world: int, tmp_path) -> dict[int, dict]:
    """Fork ``world`` gloo ranks (fork: they share this process's megatron import) and collect reports."""
    context = multiprocessing.get_context("fork")
    procs = [
        context.Process(target=_report_rank, args=(r, world, str(tmp_path / "store"), str(tmp_path)))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=120)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    assert [p.exitcode for p in procs] == [0] * world, "a gloo rank failed"
    return {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)}


REAL_REFUSED = {"cp2-pp2-pp-before-dp", "pp2-ep2-pp-first"}


@pytest.mark.parametrize("world", sorted(REAL_CASES))
def test_real_initialize_model_parallel(world, tmp_path):
    reports = _run_world(world, tmp_path)
    refused = {name for name, _ in REAL_CASES[world] if "refused" in reports[0][name]}
    assert refused == REAL_REFUSED & {name for name, _ in REAL_CASES[world]}
    for name, kwargs in REAL_CASES[world]:
        case = _case_of(world, kwargs)
        if "refused" in reports[0][name]:
            assert all("refused" in reports[r][name] for r in range(world))
            assert megatron_groups(case) is None
            with pytest.raises(LayoutError):
                case.layout()
            continue
        layout = case.layout()
        for rank in range(world):
            seen = reports[rank][name]
            assert layout.coords(rank) == seen["coords"], f"{name}: coords of rank {rank}"
            for kind in GROUP_KINDS:
                assert list(layout.group_of(kind, rank)) == seen["groups"][kind], f"{name}: {kind} of {rank}"
        assert megatron_groups(case) is not None  # the arithmetic reference agrees on acceptance
