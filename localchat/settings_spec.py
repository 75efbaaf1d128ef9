"""How a setting is declared in config.py's table (`opt`: its default, flags and help) and the flat
`SettingSpec` list that the CLI parser, the environment reader and the README test walk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {text!r}")


def parse_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def setting_meta(
    flags: tuple[str, ...],
    help: str,
    *,
    parse: Callable[[str], Any] = str,
    group: str = "server",
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    action: str | None = None,
    env_aliases: tuple[str, ...] = (),
) -> dict[str, Any]:
    return {
        "flags": flags,
        "help": help,
        "parse": parse,
        "group": group,
        "metavar": metavar,
        "choices": choices,
        "action": action,
        "env_aliases": env_aliases,
    }


def opt(default: Any, flags: tuple[str, ...], help: str, **kwargs: Any) -> Any:
    return field(default=default, metadata=setting_meta(flags, help, **kwargs))


@dataclass(frozen=True, slots=True)
class SettingSpec:
    """One setting as the CLI, the environment and the README table see it."""

    name: str
    flags: tuple[str, ...]
    env: str
    help: str
    default: Any
    group: str
    parse: Callable[[str], Any]
    metavar: str | None
    choices: tuple[str, ...] | None
    action: str | None
    env_aliases: tuple[str, ...] = ()  # older names of `env`, still read (the new name wins)


def settings_specs(settings_class: type) -> tuple[SettingSpec, ...]:
    """One spec per field of the settings dataclass, in its order, from the metadata `opt` gave it."""
    out = []
    for f in fields(settings_class):
        meta = f.metadata
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        out.append(
            SettingSpec(
                f.name,
                meta["flags"],
                "LOCALCHAT_" + f.name.upper(),
                meta["help"],
                default,
                meta["group"],
                meta["parse"],
                meta["metavar"],
                meta["choices"],
                meta["action"],
                meta["env_aliases"],
            )
        )
    return tuple(out)
