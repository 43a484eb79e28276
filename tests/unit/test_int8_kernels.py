"""The int8 weight format is chosen by running onnxruntime's kernel, and the chosen one is exact.

On x86 CPUs without VNNI, onnxruntime's uint8 x int8 product saturates 16-bit lanes
(``vpmaddubsw``); there the weights are stored as uint8 (zero point 128), whose kernel is exact.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from gpuprompt._int8 import _u8s8_is_exact, session, weight_format  # noqa: E402


def _product(a: np.ndarray, b: np.ndarray, b_zero: int | None) -> np.ndarray:
    from onnx import TensorProto, helper, numpy_helper

    inputs = ["a", "b", "one", "one", "zero"] + (["b_zero"] if b_zero is not None else [])
    initializers = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                    numpy_helper.from_array(np.array(128, np.uint8), "zero")]
    if b_zero is not None:
        initializers.append(numpy_helper.from_array(np.array(b_zero, np.uint8), "b_zero"))
    graph = helper.make_graph(
        [helper.make_node("MatMulIntegerToFloat", inputs, ["y"], domain="com.microsoft")], "product",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, a.shape[1]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, b.shape[1]])], initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return session(model.SerializeToString()).run(["y"], {"a": a})[0]


def test_the_chosen_weight_format_multiplies_exactly_on_this_cpu() -> None:
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, size=(64, 384), dtype=np.uint8)
    a[:8] = 255  # rows at the top of the range, where a 16-bit lane saturates
    levels = rng.integers(-127, 128, size=(384, 96)).astype(np.int64)
    levels[:, :8] = 127
    exact = ((a.astype(np.int64) - 128) @ levels).astype(np.float32)
    fmt = weight_format()
    assert fmt in ("s8", "u8")
    if fmt == "u8":
        got = _product(a, (levels + 128).astype(np.uint8), 128)
    else:
        got = _product(a, levels.astype(np.int8), None)
    np.testing.assert_array_equal(got, exact)
    # uint8 weights are exact everywhere; int8 weights exactly where the probe says so.
    np.testing.assert_array_equal(_product(a, (levels + 128).astype(np.uint8), 128), exact)
    assert np.array_equal(_product(a, levels.astype(np.int8), None), exact) == _u8s8_is_exact()
