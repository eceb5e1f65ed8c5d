"""``defer_torch_compile``: the ranks of ``verify`` and of the reproducers import megatron-core without importing
torch's compiler, and a compiled function still compiles, with its options, at its first call."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

from mtpdiag.fix.verify.lazy_compile import compile_on_first_call

_IMPORT_MEGATRON = """
import sys
{before}
from megatron.core import parallel_state
from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper
print(sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules))
"""


def _compiler_modules_after_megatron(before: str) -> str:
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _IMPORT_MEGATRON.format(before=before)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_megatron_imports_torchs_compiler_unless_it_is_deferred():
    # the premise, read rather than run (importing megatron-core without the deferral costs 4.7 CPU-s): its
    # @jit_fuser is torch.compile, which imports dynamo and inductor when it decorates
    spec = importlib.util.find_spec("megatron.core")
    assert spec is not None and spec.submodule_search_locations
    jit = Path(spec.submodule_search_locations[0], "jit.py").read_text()
    assert "jit_fuser = torch.compile" in jit
    deferred = "from mtpdiag.fix.verify.lazy_compile import defer_torch_compile; defer_torch_compile()"
    assert _compiler_modules_after_megatron(deferred) == "[]"


def test_a_function_is_compiled_with_its_options_at_its_first_call_and_once():
    calls = []

    def real(model, **options):
        calls.append((model.__name__, options))
        return torch.compile(model, **options)

    deferred = compile_on_first_call(real)

    @deferred(backend="eager")
    def add_one(x):
        return x + 1

    assert calls == [] and add_one.__name__ == "add_one"
    assert add_one(torch.tensor(1.0)).item() == 2.0
    assert add_one(torch.tensor(2.0)).item() == 3.0
    assert calls == [("add_one", {"backend": "eager"})]


def test_a_module_is_compiled_at_once():
    calls = []

    def real(model, **options):
        calls.append((type(model).__name__, options))
        return model

    module = torch.nn.Linear(1, 1)
    assert compile_on_first_call(real)(module, mode="reduce-overhead") is module
    assert calls == [("Linear", {"mode": "reduce-overhead"})]
