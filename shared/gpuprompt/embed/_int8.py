"""The embedder's int8 backend on CPU: its transformer exported to ONNX once, rewritten to int8
(:mod:`gpuprompt._int8`), and run in slices (:class:`OnnxForward`).

Only the forward pass changes: tokenisation, truncation, pooling and normalisation stay the
SentenceTransformer's own code, so an int8 :class:`~gpuprompt.Embedder` batches, caches and counts
tokens exactly as the fp32 one does.

The recipe, chosen by measurement on all-MiniLM-L6-v2 (2 cores; the ``embed-quant`` bench gives the
end-to-end figures): every ``MatMul`` with a constant weight runs as onnxruntime's
``MatMulIntegerToFloat`` with **per-output-channel** symmetric int8 weights and **per-token**
symmetric int8 activations (each token row scaled by its own max-abs at run time), after
SmoothQuant (alpha 0.5, calibrated on a small built-in corpus) moves outlier channels from the
activations into the weights. Cosine to fp32, mean / min:

* torch dynamic int8 of every Linear (the issue's measurement, 512 short texts): 0.951 / 0.934;
* ``onnxruntime.quantization.quantize_dynamic``, per-channel (2,300 catalogue texts and
  questions): 0.993 / 0.983 -- it scales activations per tensor, over the whole padded batch, so a
  vector also depended on its batch-mates;
* onnxruntime ``MatMulNBits`` 8-bit blockwise: 0.9997, but only 1.0-1.3x the fp32 speed here;
* per-token (3,000 guard texts): 0.9976 / 0.9959; per-token + SmoothQuant: 0.9989 / 0.9977 (the
  min is 0.986 once the guard's :data:`EDGE_TEXTS` such as ``"?"`` and ``""`` are included).

Measured on real prose (1,000 paragraphs of Python's language reference searched by 200 others; the
guard's ``agreement_at_10``), top-10 agreement with fp32 / cosine mean / speed:

* bf16 compute of the same model (the noise floor): 0.993 / 0.99999;
* this recipe (symmetric rows, alpha 0.5): 0.963 / 0.9986, about 2x fp32 (``embed-quant``);
* asymmetric rows (uint8, a zero point per token row), alpha 0.4: 0.968 / 0.9993, but 1.73x fp32 in
  bulk and 1.86x for 32 callers in the same bench (the zero point's correction is one more pass per
  MatMul): not kept, the gain in agreement is small and the speed goal recedes;
* one layer in fp32 (each of the six): 0.960-0.964, the error is spread over all 36 MatMuls; the
  FFN output layers in fp32: 0.980, but at about 1.1x fp32; 16-48 outlier channels per input in
  fp32: up to 0.979, slower than fp32 (a Gather per input in onnxruntime).

* a second int8 pass over what the first rounded away in the FFN output layers' activations
  (``x = step * (q1 + q2 / 254)``, ~15-bit activations for a third of the MACs): 0.9705 / 0.9994, at
  about 0.8x this recipe's speed (below 2x fp32);
* where the error comes from (fake quantisation in torch, same smoothing): int8 weights with exact
  activations alone give 0.981, int8 activations with exact weights 0.971; per-channel int8 weights
  already spend nearly all of the 0.02 the goal allows, and GPTQ weights (calibrated on the built-in
  corpus) did not help (0.9615).
* blockwise 8-bit (onnxruntime 1.32's ``MatMulNBits``, ``bits=8``, ``accuracy_level=4``, so the
  activations are int8 too, one scale per block of each token row; no smoothing), against fp32 ONNX on
  the AVX512-VNNI EPYC: blocks of 32 give 0.985 but 1.08x fp32's speed, blocks of 64 0.976 at 1.21x,
  blocks of 128 0.970 at 1.45x. Only the FFN output layers blockwise (32), the rest fp32: 0.9915 at
  1.02x. Smaller blocks buy agreement at the price of the speed goal, and the kernel's 4-bit path is
  no faster here (1.00x), so the bound is its per-block work, not the bit width.

So no W8A8 recipe measured keeps 0.98 of fp32's top-10 at 2x its speed. On a CPU with AMX or
AVX512-BF16, ``dtype="bfloat16"`` (prepacked, :mod:`gpuprompt._bf16`) keeps 0.993 at 1.5x (32
callers) to 2.7x (bulk) fp32's speed.

These speeds are for a CPU with VNNI (Intel with AMX), where onnxruntime's uint8 x int8 product is
exact; on a 2-core AMD EPYC with AVX512-VNNI the recipe is 2.34x (32 callers) and 2.49x (bulk) fp32,
same agreement (0.963). On x86 without VNNI (AVX2 only) that kernel saturates 16-bit lanes (top-10
agreement 0.920), so the weights are stored as uint8 there (:func:`gpuprompt._int8.weight_format`):
exact, agreement 0.959, but 1.3x (32 callers) and 1.2x (bulk) fp32 on a 2-core AMD EPYC.

With per-row scales a text's vector never depends on the batch it lands in: batched, concurrent
and one-at-a-time vectors are bit-identical, as :class:`OnnxForward` relies on.

On CUDA ``quantize`` stays off: ``"int8"`` is refused and ``"auto"`` keeps fp16. What int8 would buy
there (reasoned, not measured: no GPU was available for this work): fp16 already runs the GEMMs on
tensor cores, and for a 22M-parameter encoder at embedding batch sizes the time goes mostly to
kernel launches, attention, LayerNorm and GELU, which int8 does not touch; int8 GEMMs would halve
the weights' memory (about 45 MB to 23 MB, immaterial on a GPU) and add per-token quantise /
dequantise passes between layers. A real GPU gain would need fused int8 kernels (TensorRT or a
compiled graph), not a drop-in forward swap; onnxruntime's CPU kernels used here do not run on CUDA.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpuprompt._int8 import SlicedSession, row_slices
from gpuprompt.errors import ModelLoadError

__all__ = ["GUARD_BATCH", "RECIPE", "OnnxForward", "calibration_batches", "calibration_texts", "export_onnx"]

RECIPE = "int8-sq-pertoken-v2"
"""Names the export + rewrite + guard recipe; a new recipe builds a new cache folder."""

GUARD_BATCH = 64
"""Texts per batch when the guard and the calibration encode."""
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


# ---------------------------------------------------------------------------------------- runtime
class OnnxForward(SlicedSession):
    """The onnxruntime forward pass (the int8 graph, or the fp32 one of ``backend="onnx"``): the ONNX
    transformer, then the SentenceTransformer's own later modules.

    A batch is split into ``threads`` slices of about equal token count, each run by a one-thread
    onnxruntime call on a core of its own. The int8 graph has ~300 small nodes, and splitting each
    of them over two cores gained little (measured on an idle 2-core machine: 32 short questions
    took 24 ms on two intra-op threads and 12.5 ms as two one-thread halves, fp32 torch 49 ms;
    64 product descriptions 195 / 163 ms, fp32 torch 423 ms). Per-token scales make every
    row independent of the others, so the split never changes a vector; each slice is also cut to
    its own longest text (less padding).

    Args:
        path: the ONNX file (token embeddings out, as :func:`export_onnx` writes it).
        model: the loaded ``SentenceTransformer`` (its first module is the one replaced).
        threads: slices run at once (default: torch's thread count).
        name: the slice threads' name prefix.
    """

    def __init__(self, path: Path, model: Any, *, threads: int | None = None, name: str = "gpuprompt-int8") -> None:
        super().__init__(path, threads=threads, name=name)
        self._tail = list(model)[1:]
        tokenizer = getattr(model, "tokenizer", None)
        self._right_padded = getattr(tokenizer, "padding_side", "right") == "right"

    def __call__(self, features: dict[str, Any]) -> Any:
        """``features`` from ``SentenceTransformer.preprocess`` -> ``(batch, dim)`` sentence embeddings."""
        import torch

        slices = self._slices(features["attention_mask"])
        hidden = self.map_slices(lambda part: self._run(features, part), slices)
        if len(slices) == 1:
            return self._tail_of(features, hidden[0])
        return torch.cat([self._tail_of(features, h, part) for h, part in zip(hidden, slices)])

    def _slices(self, mask: Any) -> list[tuple[int, int, int]]:
        """``(start, stop, length)`` row slices of about equal token count, one per thread."""
        return row_slices(mask.sum(dim=1).tolist(), self._threads, width=int(mask.shape[1]),
                          right_padded=self._right_padded)

    def _run(self, features: dict[str, Any], part: tuple[int, int, int]) -> Any:
        start, stop, length = part
        feed = {name: features[name][start:stop, :length].numpy() for name in self._inputs}
        return self._session.run(["token_embeddings"], feed)[0]

    def _tail_of(self, features: dict[str, Any], hidden: Any, part: tuple[int, int, int] | None = None) -> Any:
        import torch

        if part is not None:
            start, stop, length = part
            features = {k: v[start:stop, :length] if isinstance(v, torch.Tensor) and v.dim() == 2 else v
                        for k, v in features.items()}
        else:
            features = dict(features)
            length = hidden.shape[1]
            features = {k: v[:, :length] if isinstance(v, torch.Tensor) and v.dim() == 2 else v
                        for k, v in features.items()}
        features["token_embeddings"] = torch.from_numpy(hidden)
        for module in self._tail:
            features = module(features)
        return features["sentence_embedding"]


def export_onnx(model: Any, path: Path) -> None:
    """Export the ``SentenceTransformer``'s transformer (token embeddings out) to ONNX, fp32.

    The export traces a copy with eager attention (plain MatMul + Softmax), so the loaded model
    keeps its own attention implementation.
    """
    import copy

    import torch

    transformer = model[0]
    auto = getattr(transformer, "auto_model", None) or getattr(transformer, "model", None)
    if auto is None or not hasattr(model, "preprocess"):
        raise ModelLoadError(
            f"the ONNX export (quantize='int8', backend='onnx') needs a SentenceTransformer whose first module "
            f"wraps a transformers model (got {type(transformer).__name__}); use quantize=None and backend='torch' "
            "for this model."
        )
    auto = copy.deepcopy(auto).float().eval()
    if hasattr(auto, "set_attn_implementation"):
        auto.set_attn_implementation("eager")
    features = model.preprocess(["a short text", "a longer text, so that the trace sees padding and a mask"])
    names = [n for n in _INPUTS if isinstance(features.get(n), torch.Tensor)]

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.auto = auto

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.auto(**dict(zip(names, tensors))).last_hidden_state

    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, "token_embeddings"]}
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about shapes the graph keeps dynamic
        torch.onnx.export(
            TokenEmbeddings().eval(),
            tuple(features[n].cpu() for n in names),
            str(path),
            input_names=names,
            output_names=["token_embeddings"],
            dynamic_axes=axes,
            opset_version=17,
            do_constant_folding=True,
            dynamo=False,
        )


def calibration_texts() -> list[str]:
    """The built-in calibration corpus: other products, questions and chat than the guard's."""
    from gpuprompt._corpus import catalogue, customer_questions

    return [item["text"] for item in catalogue(160, seed=3)] + customer_questions(96, seed=5)


def calibration_batches(model: Any, texts: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
    """``texts`` as the SentenceTransformer's own features, in batches, for :func:`~gpuprompt._int8.channel_maxima`."""
    for start in range(0, len(texts), GUARD_BATCH):
        features = model.preprocess(list(texts[start : start + GUARD_BATCH]))
        yield {name: value.numpy() for name, value in features.items() if hasattr(value, "numpy")}
