"""bfloat16 on CPUs that compute it natively (AMX / AVX512-BF16): prepacked linear layers.

A plain ``nn.Linear`` in bfloat16 on CPU hands its weight to oneDNN, which reorders it into the
blocked layout AMX needs on every call: for the small batches a serving queue runs (a few short
texts) the reorder costs more than the matrix product (measured on this project's 2-core Xeon,
384 -> 1536, 8 rows: fp32 736 us, bf16 ``nn.Linear`` 409 us, bf16 prepacked 125 us). Packing each
weight once at load, the way IPEX and torch.compile's freezing pass do, removes that cost; the
product itself is oneDNN's same kernel, so the output is bit-identical to ``nn.Linear`` in bf16.

Used by the embedder and the reranker when they run ``dtype="bfloat16"`` on such a CPU. Measured on
this project's 2-core Xeon (``gpuprompt bench embed-quant`` / ``rerank``): the bundled embedder keeps
0.993 of fp32's top-10 neighbours on real prose (int8: 0.963) at 2.6x fp32's bulk texts/s (1.5x
for 32 one-text callers, where per-call Python work dominates); the MiniLM-L6 cross-encoder keeps
0.978 of fp32's top-3 (int8: 0.928) at 3.0x the stock rerankers' requests/s.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

__all__ = ["bf16_is_native", "pack_for_cpu_bf16", "pack_linears"]

logger = logging.getLogger(__name__)


@functools.cache
def bf16_is_native() -> bool:
    """Whether this CPU computes bfloat16 matrix products in hardware (AMX tiles or AVX512-BF16)
    and torch's oneDNN build can pack weights for it. Where it does not, bf16 on CPU is emulated
    (often slower than fp32) and the layers are left as they are."""
    try:
        import torch

        return bool(
            torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported()
            and (torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
        )
    except (ImportError, AttributeError, RuntimeError):
        return False


@functools.cache
def _packed_linear_type() -> type:
    """The packed linear module class, built on first use so importing this module does not
    import torch."""
    import torch

    class PackedLinear(torch.nn.Module):
        """``nn.Linear`` in bfloat16 with its weight also packed once for oneDNN (AMX).

        A bfloat16 input on CPU of any leading shape runs oneDNN's product on the packed weight:
        the output equals the bf16 ``nn.Linear`` it replaces (bit for bit on contiguous input).
        Any other input (another dtype or device) takes ``F.linear`` on the plain weight, as
        ``nn.Linear`` would. The plain ``weight`` and ``bias`` stay, so code that reads
        ``layer.weight`` (T5 blocks read its dtype) and ``state_dict()`` work as before; the bf16
        weights then take twice their memory (45 MB more for MiniLM-L6). Inference on CPU only:
        the packed copy does not move with ``.to()``.
        """

        def __init__(self, linear: torch.nn.Linear) -> None:
            super().__init__()
            self.in_features = int(linear.in_features)
            self.out_features = int(linear.out_features)
            self.weight = linear.weight
            self.bias = linear.bias
            weight = linear.weight.detach().to(torch.bfloat16).contiguous()
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            self.register_buffer("packed_weight", packed, persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.dtype is not torch.bfloat16 or x.device.type != "cpu" or self.weight.dtype is not torch.bfloat16:
                return torch.nn.functional.linear(x, self.weight, self.bias)
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

        def extra_repr(self) -> str:
            return f"in_features={self.in_features}, out_features={self.out_features}, bf16 packed"

    return PackedLinear


def pack_linears(model: Any) -> int:
    """Replace each plain ``nn.Linear`` inside ``model`` (already cast to bfloat16, on CPU) by a
    packed one (same output, weight reordered once); return how many were replaced. Subclasses of
    ``nn.Linear`` (such as ``MultiheadAttention``'s ``out_proj``, which its owner reads directly)
    are left as they are. Call only where :func:`bf16_is_native`."""
    import torch

    packed_linear = _packed_linear_type()

    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is torch.nn.Linear
    ]
    packed: dict[int, Any] = {}  # a layer shared by two parents (tied weights) is packed once
    for parent, name, child in swaps:
        if id(child) not in packed:
            packed[id(child)] = packed_linear(child)
        setattr(parent, name, packed[id(child)])
    return len(packed)


def pack_for_cpu_bf16(model: Any, device: str, dtype: str) -> bool:
    """Pack ``model``'s linear layers when it runs bfloat16 on a CPU that computes bf16 natively;
    return whether it did. Anywhere else (CUDA, fp32, fp16, a CPU without bf16 units) it leaves the
    model as it is: there the plain layers are already what the hardware runs best."""
    if device != "cpu" or dtype != "bfloat16":
        return False
    if not bf16_is_native():
        logger.warning("dtype='bfloat16' on a CPU without AMX or AVX512-BF16: bf16 is emulated there and usually "
                       "slower than float32; leave dtype unset (float32) unless you need the memory.")
        return False
    pack_linears(model)
    return True
