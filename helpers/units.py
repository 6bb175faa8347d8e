"""Units shown to people (ground floor): bytes as MiB, one definition."""
from __future__ import annotations

MIB = 2 ** 20  # bytes


def mib_text(n: float | None) -> str:
    """Bytes as whole MiB text ('1,234 MiB'); 'n/a' for None."""
    return "n/a" if n is None else f"{n / MIB:,.0f} MiB"
