"""How one MindFormers value becomes workbook settings: small converters the key tables are written with.

A converter takes the source value and returns {workbook key: value} (keys starting `mf.` are intermediate and
are combined later by `derive`), or raises `Refused` with why the value cannot be honoured and what to do.
"""
from __future__ import annotations

import math
from typing import Any, Callable

Convert = Callable[[Any], dict]
NULL = (None, "None", "none")  # how recipes write "unset"


class Refused(Exception):
    """A value the workbook cannot honour. `why` says so and what to do; `reduced` (non-empty when the value only
    sizes the model or its parallel layout) is what `--scale` does instead, so a CPU try-out still comes in."""

    def __init__(self, why: str, reduced: str = ""):
        super().__init__(why)
        self.why = why
        self.reduced = reduced


def whole(v: Any) -> int:
    """A whole number: an int, a float without a fraction (32.0) or a string of one. A fraction or true/false is
    refused rather than cut (int(2.5) is 2, int(True) is 1)."""
    if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
        raise Refused(f"must be a whole number, not {v!r}")
    return int(v)


def knob_bound(key: str) -> int | None:
    """The upper bound (`le`) the workbook's config puts on `key` (dotted, e.g. 'model.d_model'), None when it has
    none or is no config key."""
    import dataclasses

    from helpers.config import Config
    obj: Any = Config()
    *sections, name = key.split(".")
    for section in sections:
        obj = getattr(obj, section, None)
        if obj is None or not dataclasses.is_dataclass(obj):
            return None
    field = next((f for f in dataclasses.fields(obj) if f.name == name), None)
    return field.metadata.get("le") if field is not None else None


def to(key: str, kind: type = str, bound: str = "") -> Convert:
    """The value, converted by `kind` (int: `whole`), sets `key`. A whole number past the config's bound on `bound`
    (default: `key`) is refused naming it: a size of 1e23 is a slip, not a model to plan."""
    if kind is not int:
        return lambda v: {key: kind(v)}

    def read(v):
        n = whole(v)
        limit = knob_bound(bound or key)
        if limit is not None and n > limit:
            raise Refused(f"must be a whole number ≤ {limit:,} (the workbook's bound on {bound or key}), not {v!r}; "
                          f"fix the value (a typo or a unit slip)")
        return {key: n}
    return read


def unless_none(key: str, kind: type = str) -> Convert:
    """As `to`, but null (or the string 'None') sets nothing."""
    read = to(key, kind)
    return lambda v: {} if v in NULL else read(v)


def at_least(key: str, least: int) -> Convert:
    """A whole number ≥ `least` sets `key` (a factor the import multiplies or divides by)."""
    def read(v):
        n = whole(v)
        if n < least:
            raise Refused(f"must be a whole number ≥ {least}, not {v!r}")
        return {key: n}
    return read


def positive(key: str) -> Convert:
    """A finite number > 0 sets `key`; null (or 'None') sets nothing."""
    def read(v):
        if v in NULL:
            return {}
        if isinstance(v, bool) or not 0 < float(v) < math.inf:
            raise Refused(f"must be a finite number > 0, not {v!r}")
        return {key: float(v)}
    return read


def nothing(v: Any) -> dict:
    """The value has no effect here (the table row says why)."""
    return {}


def only(allowed: tuple, why: str, reduced: str = "") -> Convert:
    """Nothing to set while the value is one of `allowed`; any other value is refused with `why`."""
    def check(v):
        if v not in allowed:
            raise Refused(why, reduced)
        return {}
    return check


def off(what: str) -> Convert:
    """A feature the workbook does not have: accepted while off."""
    return only((*NULL, False, 0), f"{what} is not available in the workbook: set it to False")


def one_process(what: str) -> Convert:
    """A model-sharding degree: 1 (or unset) is the workbook's data-parallel layout; more is refused at full size
    and dropped by --scale (the planner still sizes the recipe per its other settings)."""
    def check(v):
        if v not in (None, 1, 0):
            raise Refused(f"{what} splits the model over several devices; the workbook trains data parallel only "
                          f"(a whole model per process): set it to 1, or import with --scale PRESET for a CPU "
                          f"try-out", reduced=f"{what}: 1 (a whole model per process)")
        return {}
    return check


def choose(table: dict, key: str, what: str) -> Convert:
    """Look the value up in `table` (source value → workbook value); another value is refused naming the choices."""
    def pick(v):
        if v not in table:
            raise Refused(f"{what} must be one of {', '.join(map(str, table))}")
        return {key: table[v]}
    return pick


def flag(key: str, invert: bool = False) -> Convert:
    """A true/false value (YAML booleans or 'True'/'False' strings) sets a boolean key."""
    def read(v):
        if isinstance(v, str) and v.lower() in ("true", "false"):
            v = v.lower() == "true"
        if not isinstance(v, (bool, int)):
            raise ValueError(v)
        return {key: bool(v) != invert}
    return read


DTYPES = {"float32": {"amp_level": "O0"}, "float16": {"amp_level": "O2", "amp_dtype": "fp16"},
          "bfloat16": {"amp_level": "O2", "amp_dtype": "bf16"}}


def compute_dtype(v: Any) -> dict:
    """float16/bfloat16 compute on float32 weights is the workbook's AMP O2."""
    if v not in DTYPES:
        raise Refused("compute_dtype must be float32, float16 or bfloat16")
    return DTYPES[v]
