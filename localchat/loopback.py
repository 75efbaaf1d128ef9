"""Whether a host name or address is this machine only: `localhost` or any loopback address
(127.0.0.0/8, ::1), compared as addresses rather than as spellings (127.0.0.2 and [::1] are loopback)."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    name = host.strip().lower().removeprefix("[").removesuffix("]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
