"""What a rank of a CPU world that mtpdiag starts does before it imports megatron-core: ``verify``'s worlds and
the examples' reproducers. Neither changes what the rank runs or where it waits; both cut what it costs a loaded
machine (see each module)."""

from __future__ import annotations

from mtpdiag.fix.verify.gloo_device import share_gloo_device
from mtpdiag.fix.verify.lazy_compile import defer_torch_compile


def prepare_cpu_rank() -> None:
    """``torch.compile`` at a function's first call (``lazy_compile``) and every gloo group on one transport
    device (``gloo_device``): call at import, before megatron-core and ``init_process_group``."""
    defer_torch_compile()
    share_gloo_device()
