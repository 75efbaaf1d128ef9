"""`--isq q4`: unquantized linears become 4-bit at load and run through the int4 kernel (CPU, bf16).

The quantizer's codes and the kernel's rule (q - 8) * scale + zero reproduce each value within half a
quantization step; a whole tiny model with quantized linears gives the logits of the same model whose
weights were replaced by those dequantized values (up to bf16 rounding), so nothing else changed.
"""

from __future__ import annotations

import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch import quant
from localchat.backends.torch.cuda.quant_cuda import dequantize_q4, quantize_q4
from localchat.backends.torch.quant import Int4Weight
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import BackendUnavailableError
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import bundle_from_hf, tiny_hf_model

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_round_trip_within_half_a_step_and_constant_groups() -> None:
    gen = torch.Generator().manual_seed(0)
    matrix = torch.randn(48, 96, generator=gen) * torch.linspace(0.01, 10, 96)  # wide range of scales
    matrix[3, :32] = 0.7  # a constant group: scale 0, every value exact
    codes, scale, zero = quantize_q4(matrix)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    back = dequantize_q4(codes, scale, zero)
    assert torch.equal(scale, scale.bfloat16().float()) and torch.equal(zero, zero.bfloat16().float())
    # Half a step, plus the slack of picking codes against a zero rounded to bf16 (2^-8 of it).
    step = scale.repeat_interleave(32, dim=1)
    slack = (zero.abs() * 2.0**-8).repeat_interleave(32, dim=1)
    assert bool(((back - matrix).abs() <= step / 2 + slack + 1e-6).all())
    torch.testing.assert_close(back[3, :32], torch.full((32,), 0.7), atol=0.7 * 2.0**-8, rtol=0)


@pytest.mark.skipif(not quant.int4_kernel_available(), reason="torch lacks the int4 CPU kernel")
def test_isq_model_matches_the_same_model_on_dequantized_weights() -> None:
    hf = tiny_hf_model("llama")
    isq = TorchRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="bfloat16", isq="q4"))
    assert isinstance(isq.model.layers[0].qkv, Int4Weight) and isinstance(
        isq.model.layers[1].down, Int4Weight
    )
    assert "int4" in isq.device_name
    assert isinstance(isq.model.lm_head, torch.Tensor)  # the output layer stays dense
    with torch.no_grad():  # the reference: every linear replaced by what the int4 kernel computes
        for name, param in hf.named_parameters():
            if name.split(".")[-2] in LINEARS:
                param.copy_(dequantize_q4(*quantize_q4(param)))
    reference = TorchRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="bfloat16"))
    prompts = [[5, 9, 30, 44, 2, 17, 8], [60, 61]]

    def logits(runner: TorchRunner) -> torch.Tensor:
        driver = PagedDriver(runner)
        for i, prompt in enumerate(prompts):
            driver.add(f"r{i}", prompt)
        return driver.step_logits(every_token=True)[1]

    got, expected = logits(isq), logits(reference)
    # Only bf16 activations round differently (the weights are the same values): ~2% of the range.
    scale = expected.abs().max()
    assert float((got - expected).abs().max()) < 0.04 * float(scale)
    assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()


def test_isq_needs_an_int4_kernel() -> None:
    with pytest.raises(BackendUnavailableError, match="--isq q4 needs bfloat16"):
        TorchRunner(
            bundle_from_hf(tiny_hf_model("llama")), RunnerOptions(device="cpu", dtype="float32", isq="q4")
        )
