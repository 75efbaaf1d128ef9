"""The hybrid layers' Triton decode kernels (triton_recurrent.py: causal conv window, gated DeltaNet and
Mamba-2 one-token updates), run by Triton's interpreter on CPU tensors against the torch recurrent forms:
several rows on scattered slots over consecutive steps, states written in place for those slots only;
then a tiny Qwen3.5, Granite 4.0-H (Mamba-2) and LFM2 (short conv) decode through the layer code with
the kernels forced on, against the same models on the torch forms. Speed needs a GPU."""

from __future__ import annotations

import os
from typing import cast

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton decorates the kernels

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

import torch
import torch.nn.functional as F

from localchat.backends.torch.cuda import triton_recurrent
from localchat.backends.torch.gated_deltanet import conv_decode, delta_rule_step, l2_normalize
from localchat.backends.torch.mamba2 import ssd_step
from localchat.backends.torch.recurrent_kernels import use_triton_recurrent
from localchat.backends.torch.runner import TorchRunner
from localchat.backends.torch.short_conv import conv_step
from localchat.backends.torch.state_cache import StateCache
from tests.helpers.torch_models import bundle_from_hf, fp32_runner

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter (set before import)"
)
SLOTS = torch.tensor([5, 1, 3])  # rows' slots, out of order; slots 0, 2, 4 and 6 belong to no row
NUM_SLOTS = 7
ATOL = 1e-5


def _untouched(before: torch.Tensor, after: torch.Tensor) -> None:
    others = [s for s in range(NUM_SLOTS) if s not in SLOTS.tolist()]
    assert torch.equal(before[others], after[others])


@pytest.mark.parametrize(("bias", "silu"), [(False, True), (True, False)], ids=["deltanet", "short-conv"])
def test_conv_step_matches_the_torch_forms(bias: bool, silu: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    channels, width = 40, 4  # 40: a ragged channel tile
    windows = torch.randn(NUM_SLOTS, channels, width - 1, generator=gen)
    weight = torch.randn(channels, width, generator=gen)
    b = torch.randn(channels, generator=gen) if bias else None
    ref = windows.clone()
    for _ in range(3):
        x = torch.randn(len(SLOTS), channels, generator=gen)
        before = windows.clone()
        out = triton_recurrent.conv_step(x, windows, SLOTS, weight, b, silu=silu)
        if silu:
            assert b is None
            expected, new = conv_decode(x, ref[SLOTS], weight)
        else:
            expected, new = conv_step(x, ref[SLOTS], weight, b)
        ref[SLOTS] = new
        torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(windows, ref, atol=0, rtol=0)  # the window is a copy of inputs: exact
        _untouched(before, windows)


def test_delta_rule_step_matches_the_torch_form() -> None:
    gen = torch.Generator().manual_seed(1)
    nk, nv, dk, dv = 2, 4, 16, 8  # two value heads per key head
    states = torch.randn(NUM_SLOTS, nv, dk, dv, generator=gen)
    ref = states.clone()
    for _ in range(3):
        mixed = torch.randn(len(SLOTS), 2 * nk * dk + nv * dv, generator=gen)
        g = -F.softplus(torch.randn(len(SLOTS), nv, generator=gen))
        beta = torch.sigmoid(torch.randn(len(SLOTS), nv, generator=gen))
        before = states.clone()
        out = triton_recurrent.delta_rule_step(mixed, g, beta, states, SLOTS, nk)
        # the torch form, as models/qwen3_next.py feeds it
        q = l2_normalize(mixed[:, : nk * dk].view(-1, nk, dk)).repeat_interleave(nv // nk, 1) * dk**-0.5
        k = l2_normalize(mixed[:, nk * dk : 2 * nk * dk].view(-1, nk, dk)).repeat_interleave(nv // nk, 1)
        v = mixed[:, 2 * nk * dk :].view(-1, nv, dv)
        expected, new = delta_rule_step(q, k, v, g, beta, ref[SLOTS])
        ref[SLOTS] = new
        torch.testing.assert_close(out, expected, atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(states, ref, atol=ATOL, rtol=1e-5)
        _untouched(before, states)


def test_ssd_step_matches_the_torch_form() -> None:
    gen = torch.Generator().manual_seed(2)
    heads, groups, head_dim, d_state = 4, 2, 8, 16
    states = torch.randn(NUM_SLOTS, heads, head_dim, d_state, generator=gen)
    dt_bias, a_log, d = (torch.randn(heads, generator=gen) for _ in range(3))
    ref = states.clone()
    for step in range(3):
        xbc = torch.randn(len(SLOTS), heads * head_dim + 2 * groups * d_state, generator=gen)
        dt_raw = torch.randn(len(SLOTS), heads, generator=gen) + (
            25.0 if step == 2 else 0.0
        )  # softplus's linear part
        before = states.clone()
        out = triton_recurrent.ssd_step(xbc, dt_raw, dt_bias, a_log, d, states, SLOTS, groups)
        # the torch form, as mamba2.Mamba2Mixer feeds it
        x = xbc[:, : heads * head_dim].view(-1, heads, head_dim)
        per_head = heads // groups
        b = xbc[:, heads * head_dim : heads * head_dim + groups * d_state].view(-1, groups, d_state)
        c = xbc[:, heads * head_dim + groups * d_state :].view(-1, groups, d_state)
        dt = F.softplus(dt_raw + dt_bias)
        y, new = ssd_step(
            x,
            dt,
            dt * -a_log.exp(),
            b.repeat_interleave(per_head, 1),
            c.repeat_interleave(per_head, 1),
            ref[SLOTS],
        )
        ref[SLOTS] = new
        torch.testing.assert_close(out, y + x * d[:, None], atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(states, ref, atol=ATOL, rtol=1e-5)
        _untouched(before, states)


def test_the_kernels_are_chosen_only_when_asked_off_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.delenv("LOCALCHAT_TORCH_ATTENTION", raising=False)
    assert not use_triton_recurrent(cpu)  # auto: the torch forms on a CPU
    monkeypatch.setenv("LOCALCHAT_TORCH_ATTENTION", "torch")
    assert not use_triton_recurrent(cpu)
    monkeypatch.setenv("LOCALCHAT_TORCH_ATTENTION", "triton")
    assert use_triton_recurrent(cpu)  # under the interpreter


def _decode_both_ways(
    monkeypatch: pytest.MonkeyPatch, hf: torch.nn.Module, prompts: dict[str, list[int]]
) -> dict[str, int]:
    """Prefill the prompts on two runners of the same weights (torch forms), then decode three steps:
    one runner on the torch forms, the other with the Triton kernels forced; logits and states agree."""
    from tests.backends.test_qwen3_next import HybridDriver

    calls: dict[str, int] = {}

    def counted(name: str) -> None:
        kernel = getattr(triton_recurrent, name)

        def wrapper(*args: object, **kwargs: object) -> torch.Tensor:
            calls[name] = calls.get(name, 0) + 1
            return kernel(*args, **kwargs)

        monkeypatch.setattr(triton_recurrent, name, wrapper)

    for name in ("conv_step", "delta_rule_step", "ssd_step"):
        counted(name)
    monkeypatch.delenv("LOCALCHAT_TORCH_ATTENTION", raising=False)
    runners: list[TorchRunner] = []
    drivers = []
    for _ in range(2):
        runner = fp32_runner(bundle_from_hf(hf))
        runner.initialize_state_cache(4)
        driver = HybridDriver(runner)
        driver.slot_of = {"a": 3, "b": 1}  # scattered slots; 0 and 2 stay empty
        for req_id, prompt in prompts.items():
            driver.add(req_id, prompt)
        driver.step()
        runners.append(runner)
        drivers.append(driver)
    # Each runner's resolved copy is what its steps read (attention itself was chosen at load: torch)
    runners[1].backend_settings["LOCALCHAT_TORCH_ATTENTION"] = "triton"
    for _ in range(3):
        rows = [driver.step_logits() for driver in drivers]
        (ids, torch_logits), (triton_ids, triton_logits) = rows
        assert ids == triton_ids
        torch.testing.assert_close(triton_logits, torch_logits, atol=1e-4, rtol=0)
        for row, req_id in enumerate(ids):
            for driver in drivers:
                driver.feed(req_id, int(torch_logits[row].argmax()))
    torch_states, triton_states = (cast(StateCache, r.model.states) for r in runners)
    for a, b in zip(
        torch_states.recurrent + torch_states.conv, triton_states.recurrent + triton_states.conv, strict=True
    ):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
        assert not b[[0, 2]].any()  # no row's slot: never written
    return calls


def test_qwen3_5_decode_with_the_kernels_matches_the_torch_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.backends.test_qwen3_next import PROMPT, tiny_qwen3_5

    calls = _decode_both_ways(monkeypatch, tiny_qwen3_5(), {"a": PROMPT[:9], "b": PROMPT[20:25]})
    assert calls == {"conv_step": 3 * 2, "delta_rule_step": 3 * 2}  # 3 steps x 2 DeltaNet layers


def test_mamba2_decode_with_the_kernels_matches_the_torch_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.backends.test_granitemoehybrid import PROMPT, tiny_granite

    calls = _decode_both_ways(monkeypatch, tiny_granite(), {"a": PROMPT[:9], "b": PROMPT[20:25]})
    assert calls == {"conv_step": 3 * 2, "ssd_step": 3 * 2}  # 3 steps x 2 Mamba-2 layers


def test_lfm2_short_conv_decode_with_the_kernel_matches_the_torch_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.backends.test_lfm2 import PROMPT, tiny_lfm2

    calls = _decode_both_ways(monkeypatch, tiny_lfm2(), {"a": PROMPT[:9], "b": PROMPT[20:25]})
    assert calls == {"conv_step": 3 * 2}  # 3 steps x 2 short-conv layers
