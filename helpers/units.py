"""Units shown to people (ground floor): bytes as MiB or GiB, one definition each."""
from __future__ import annotations

MIB = 2 ** 20  # bytes
GIB = 2 ** 30  # bytes


def mib_text(n: float | None) -> str:
    """Bytes as whole MiB text ('1,234 MiB'); 'n/a' for None."""
    return "n/a" if n is None else f"{n / MIB:,.0f} MiB"


def gib_text(n: float) -> str:
    """Bytes as GiB text with one decimal ('37.3 GiB'), for sizes far beyond what MiB reads well in."""
    return f"{n / GIB:,.1f} GiB"
