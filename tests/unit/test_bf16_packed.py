"""Prepacked bf16 linear layers (``gpuprompt._bf16``): the same output as ``nn.Linear`` in bf16,
any leading shape, only on CPUs that compute bf16 natively (AMX / AVX512-BF16)."""

from __future__ import annotations

import pytest
import torch

from gpuprompt._bf16 import bf16_is_native, pack_for_cpu_bf16, pack_linears

native = pytest.mark.skipif(not bf16_is_native(), reason="this CPU has no native bf16 (AMX or AVX512-BF16)")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.Linear(96, 8, bias=False))
    return model.to(torch.bfloat16).eval()


@native
@pytest.mark.parametrize("shape", [(1, 48), (7, 48), (3, 5, 48), (64, 48)])
def test_packed_layers_give_the_same_output(shape: tuple[int, ...]) -> None:
    plain, packed = _model(), _model()
    assert pack_linears(packed) == 2
    assert all(type(m) is not torch.nn.Linear for m in packed.modules())
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(plain(x), packed(x))
    assert "bf16 packed" in repr(packed)


def test_only_bf16_on_cpu_is_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    assert not pack_for_cpu_bf16(model, "cpu", "float32")
    assert not pack_for_cpu_bf16(model, "cuda:0", "bfloat16")
    monkeypatch.setattr("gpuprompt._bf16.bf16_is_native", lambda: False)
    assert not pack_for_cpu_bf16(model, "cpu", "bfloat16")  # emulated bf16: left as it is
    assert sum(type(m) is torch.nn.Linear for m in model.modules()) == 2
