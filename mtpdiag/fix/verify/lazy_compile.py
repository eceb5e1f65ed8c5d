"""Make ``torch.compile`` wrap a function at its first call instead of when it is decorated.

megatron-core decorates its fused kernels with ``torch.compile`` (``megatron.core.jit.jit_fuser``) when they are
imported, and each decoration imports ``torch._dynamo`` and ``torch._inductor``: importing ``parallel_state``
and ``MTPLossLoggingHelper`` cost a rank 4.7 CPU-s, 2.8 with this (torch 2.13, megatron-core 0.16.1, measured
with ``/usr/bin/time`` on these 2-core machines). A compiled function compiles at its first call anyway, so
wrapping it then changes when dynamo is imported, not what runs; the CPU worlds of ``verify`` and of the
reproducers never call one. torch has no switch for this, and megatron's ``disable_jit_fuser`` can only be
called after ``megatron.core`` imported the kernels. Imports nothing but torch, and only when called.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


def defer_torch_compile() -> None:
    """Replace ``torch.compile`` by ``compile_on_first_call`` of itself: call before importing megatron-core."""
    import torch

    if not getattr(torch.compile, "_mtpdiag_deferred", False):
        torch.compile = compile_on_first_call(torch.compile)


def compile_on_first_call(real: Callable[..., Any]) -> Callable[..., Any]:
    """``real`` (``torch.compile``) for modules and everything but plain functions; a plain function, decorated
    with or without options, is handed to ``real`` at its first call."""

    def deferred(model: Any = None, **options: Any) -> Any:
        if model is None:  # @torch.compile(...): the options now, the function next
            return lambda fn: deferred(fn, **options)
        if not inspect.isfunction(model):
            return real(model, **options)
        compiled: Callable[..., Any] | None = None

        @functools.wraps(model)
        def first_call(*args: Any, **kwargs: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                compiled = real(model, **options)
            return compiled(*args, **kwargs)

        return first_call

    deferred._mtpdiag_deferred = True  # type: ignore[attr-defined]
    return deferred
