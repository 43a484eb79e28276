"""Prepacked bf16 linear layers (``gpuprompt._bf16``): the same output as ``nn.Linear`` in bf16,
any leading shape, only on CPUs that compute bf16 natively (AMX / AVX512-BF16); the plain weight
stays readable, other inputs take the plain path."""

from __future__ import annotations

import logging

import pytest
import torch

from gpuprompt._bf16 import bf16_is_native, pack_for_cpu_bf16, pack_linears

native = pytest.mark.skipif(not bf16_is_native(), reason="this CPU has no native bf16 (AMX or AVX512-BF16)")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.Linear(96, 8, bias=False))
    return model.to(torch.bfloat16).eval()


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)


@native
@pytest.mark.parametrize("shape", [(48,), (1, 48), (7, 48), (3, 5, 48), (64, 48)])
def test_packed_layers_give_the_same_output(shape: tuple[int, ...]) -> None:
    plain, packed = _model(), _model()
    assert pack_linears(packed) == 2
    assert all(type(m) is not torch.nn.Linear for m in packed.modules())
    with torch.inference_mode():
        assert torch.equal(plain(_x(*shape)), packed(_x(*shape)))
    assert "bf16 packed" in repr(packed)


@native
def test_the_plain_weight_stays_and_other_inputs_take_the_plain_path() -> None:
    plain, packed = _model(), _model()
    pack_linears(packed)
    layer = packed[0]
    assert layer.weight.dtype is torch.bfloat16 and layer.weight.shape == (96, 48)  # T5 reads weight.dtype
    assert set(packed.state_dict()) == set(plain.state_dict())  # nothing is lost from a saved model
    x = _x(4, 48).float()
    with torch.inference_mode(), pytest.raises(RuntimeError):
        plain(x)  # nn.Linear refuses float32 input on bf16 weights ...
    with torch.inference_mode(), pytest.raises(RuntimeError):
        packed(x)  # ... and so does the packed layer (the same F.linear), never a wrong result
    non_contiguous = _x(3, 48, 5).transpose(1, 2)
    with torch.inference_mode():
        reference = plain[0](non_contiguous.contiguous())
        assert torch.equal(layer(non_contiguous), reference)


@native
def test_a_layer_shared_by_two_parents_is_packed_once() -> None:
    shared = torch.nn.Linear(8, 8).to(torch.bfloat16)
    model = torch.nn.ModuleDict({"a": torch.nn.Sequential(shared), "b": torch.nn.Sequential(shared)})
    assert pack_linears(model) == 1
    assert model["a"][0] is model["b"][0]


def test_only_bf16_on_cpu_is_packed(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    assert not pack_for_cpu_bf16(model, "cpu", "float32")
    assert not pack_for_cpu_bf16(model, "cuda:0", "bfloat16")
    monkeypatch.setattr("gpuprompt._bf16.bf16_is_native", lambda: False)
    with caplog.at_level(logging.WARNING, logger="gpuprompt._bf16"):
        assert not pack_for_cpu_bf16(model, "cpu", "bfloat16")  # emulated bf16: left as it is, and said
    assert any("without AMX or AVX512-BF16" in r.message for r in caplog.records)
    assert sum(type(m) is torch.nn.Linear for m in model.modules()) == 2
