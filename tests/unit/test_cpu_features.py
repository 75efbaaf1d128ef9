"""The CPU-dependent choices (cpu_features.py) for each CPU localchat meets, as the flags /proc/cpuinfo
lists for it, and LOCALCHAT_EMULATE_CPU making this machine choose as another CPU would."""

from __future__ import annotations

import pytest

from localchat import cpu_features as cf
from localchat.errors import BackendUnavailableError

# /proc/cpuinfo flags of real CPUs (the subset that matters, plus a few that must not)
SAPPHIRE_RAPIDS = {"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
SAPPHIRE_RAPIDS |= {"avx512_bf16", "amx_bf16", "amx_int8"}
ICE_LAKE = {"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}  # no BF16
SKYLAKE_X = {"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512cd"}  # no VNNI
ZEN3 = {"sse4_2", "avx", "avx2", "fma", "bmi2"}
IVY_BRIDGE = {"sse4_2", "avx"}  # AVX without AVX2
GRAVITON3 = {"fp", "asimd", "asimddp", "sve", "bf16"}  # aarch64 Features
CORTEX_A53 = {"fp", "asimd"}  # aarch64 without the dot product

# CPU -> (kernels' ISA under auto, x16 layout, compute dtype under --dtype auto)
EXPECTED = {
    "sapphire_rapids": (SAPPHIRE_RAPIDS, "avx512vnni", True, "bfloat16"),
    "ice_lake": (ICE_LAKE, "avx512vnni", True, "float32"),
    "skylake_x": (SKYLAKE_X, "avx2", True, "float32"),
    "zen3": (ZEN3, "avx2", True, "float32"),
    "ivy_bridge": (IVY_BRIDGE, "portable", False, "float32"),
    "graviton3": (GRAVITON3, "neon", True, "float32"),
    "cortex_a53": (CORTEX_A53, "portable", False, "float32"),
}


@pytest.mark.parametrize("cpu", sorted(EXPECTED))
def test_choices_per_cpu(cpu: str) -> None:
    flags, isa, x16, dtype = EXPECTED[cpu]
    assert cf.best_isa(cf.runnable_isas(flags)) == isa
    assert cf.repacks(cf.best_isa(cf.runnable_isas(flags))) is x16
    assert cf.compute_dtype(flags) == dtype
    assert "portable" in cf.runnable_isas(flags)  # portable C runs everywhere


def test_layout_setting_and_named_isas() -> None:
    assert not cf.repacks("avx512vnni", "gguf")  # LOCALCHAT_KERNEL_LAYOUT=gguf keeps the file's blocks
    assert not cf.repacks("portable") and not cf.repacks(None)  # no x16 kernels / no kernels at all
    assert cf.runnable_isas(SAPPHIRE_RAPIDS) == ["portable", "avx2", "avx512vnni"]
    assert cf.best_isa(["portable", "avx2"]) == "avx2"
    assert cf.best_isa([]) == "portable"
    # AVX-512 VNNI without AVX2's FMA is no CPU anyone sells, but the library's test requires both
    assert cf.runnable_isas({"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}) == ["portable"]


@pytest.mark.parametrize("name", sorted(cf.EMULATED))
def test_emulation_narrows_this_cpu(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Emulating a CPU: the flags every choice reads are the host's and that CPU's at once, and the
    kernels' ISAs it does not have are refused, whatever the host runs."""
    monkeypatch.setenv(cf.EMULATE_ENV, name)
    flags = cf.cpu_flags()
    assert flags <= cf.EMULATED[name] and flags <= cf.host_flags()
    for isa in cf.KERNEL_ISAS:
        assert cf.allowed(isa) == (isa in cf.runnable_isas(cf.EMULATED[name]))
    if name != "avx512vnni":  # only that profile has native bf16
        assert cf.compute_dtype(flags) == "float32"
    env = cf.torch_env(name)
    assert env[cf.EMULATE_ENV] == name
    assert (env.get("ATEN_CPU_CAPABILITY"), name) in {(None, "avx512vnni"), ("avx512", "avx512")} | {
        ("avx2", "avx2"),
        ("default", "portable"),
    }


def test_no_emulation_and_bad_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cf.EMULATE_ENV, raising=False)
    assert cf.cpu_flags() == cf.host_flags()
    assert all(cf.allowed(isa) for isa in cf.KERNEL_ISAS)  # the library decides alone
    monkeypatch.setenv(cf.EMULATE_ENV, "pentium")
    with pytest.raises(BackendUnavailableError, match="pentium"):
        cf.cpu_flags()
