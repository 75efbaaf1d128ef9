"""The torch backend's seven tuning variables (docs/backends.md): their table, how a value is read and
checked, and the copy a runner resolves once.

They are environment variables only (no flag; `--help` lists them). `resolve_backend_variables` checks
all seven at once where an app starts (serving.assembly, `LLM`), so one wrong value fails before any
weight loads, naming every wrong variable. The result travels in `RunnerOptions.backend_settings`. A
torch runner puts its copy in effect on its thread while it loads and during each step
(`settings_in_effect`), so the helpers deep in the backend that ask `backend_variable` get the runner's
values. Outside a runner they read the environment, which is also where the defaults come from.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from localchat.cpu_features import KERNEL_ISAS
from localchat.errors import BackendUnavailableError


@dataclass(frozen=True, slots=True)
class BackendVariable:
    """A torch backend tuning variable: its name, default, accepted values and what it sets."""

    env: str
    default: str
    choices: tuple[str, ...]
    noun: str  # "X='v' is not <noun>"
    help: str


BACKEND_VARIABLES: tuple[BackendVariable, ...] = (
    BackendVariable(
        "LOCALCHAT_KERNELS",
        "auto",
        ("auto", "off", *KERNEL_ISAS),
        "an ISA",
        "the CPU kernels' ISA: auto, off, or one ISA by name",
    ),
    BackendVariable(
        "LOCALCHAT_KERNEL_LAYOUT",
        "auto",
        ("auto", "gguf"),
        "a layout",
        "auto: x16 panels where the ISA has their kernels; gguf: the file's blocks on the portable C reference",
    ),
    BackendVariable(
        "LOCALCHAT_KERNEL_ACTIVATIONS",
        "auto",
        ("auto", "q8", "precise"),
        "an activation mode",
        "how the kernels round activations (auto: precise for small models, q8 for bigger ones)",
    ),
    BackendVariable(
        "LOCALCHAT_TORCH_QUANT",
        "auto",
        ("auto", "int4", "dequant", "copies"),
        "a quantization mode",
        "the torch weight mode for quantized matrices",
    ),
    BackendVariable(
        "LOCALCHAT_DECODE_STEP",
        "fused",
        ("fused", "layers"),
        "a choice",
        "fused: one C call per decode step where it applies; layers: the per-layer path",
    ),
    BackendVariable(
        "LOCALCHAT_TORCH_ATTENTION",
        "auto",
        ("auto", "torch", "triton"),
        "an attention kernel",
        "auto: Triton on CUDA, else the CPU kernels; torch: plain PyTorch",
    ),
    BackendVariable(
        "LOCALCHAT_CUDA_INT4",
        "auto",
        ("auto", "both", "triton", "tinygemm"),
        "a choice",
        "the CUDA 4-bit kernel(s): both forms where memory allows, Triton's, or torch's tinygemm",
    ),
)
_BACKEND_BY_ENV = {v.env: v for v in BACKEND_VARIABLES}

# The settings of the runner working on this thread (settings_in_effect); None: the environment's.
_in_effect = threading.local()


def backend_variable(env: str, environ: Mapping[str, str] | None = None) -> str:
    """One backend variable's value: the runner's copy while one is in effect (and no `environ` is
    given), else the environment's (trimmed, lower case, the default when unset or empty), refused with
    the accepted values when it is not one of them."""
    if environ is None and (settings := getattr(_in_effect, "settings", None)) is not None:
        return settings[env]
    return _parse(_BACKEND_BY_ENV[env], os.environ if environ is None else environ)


def _parse(var: BackendVariable, environ: Mapping[str, str]) -> str:
    value = environ.get(var.env, "").strip().lower() or var.default
    if value not in var.choices:
        raise BackendUnavailableError(
            f"{var.env}={value!r} is not {var.noun}; use one of {', '.join(var.choices)}."
        )
    return value


def backend_choices(env: str) -> tuple[str, ...]:
    """The values a backend variable accepts (its table entry's)."""
    return _BACKEND_BY_ENV[env].choices


def resolve_backend_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """All seven variables' values from `environ` (default: the process environment), checked at once:
    every wrong one is named in a single error."""
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    problems: list[str] = []
    for var in BACKEND_VARIABLES:
        try:
            values[var.env] = _parse(var, environ)
        except BackendUnavailableError as exc:
            problems.append(exc.message)
    if problems:
        raise BackendUnavailableError(" ".join(problems))
    return values


@contextmanager
def settings_in_effect(settings: Mapping[str, str]) -> Iterator[None]:
    """Make a runner's resolved copy what `backend_variable` answers on this thread (nested: the inner
    one wins until it ends)."""
    outer = getattr(_in_effect, "settings", None)
    _in_effect.settings = settings
    try:
        yield
    finally:
        _in_effect.settings = outer
