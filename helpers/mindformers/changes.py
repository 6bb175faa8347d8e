"""What a flag of `import-config` (`--target`, `--scale`) changes in an imported config: each change is a row of the
mapping table named after the flag, with the old value, the new `key=value` and why."""
from __future__ import annotations

from typing import Any, Callable, Union

from helpers.config import flatten, from_dict
from helpers.mindformers.importer import Imported, Row, flat, nested

# key → (the new value, or a function of the old value and the whole config before the flag; why).
Change = tuple[Union[Any, Callable[[Any, dict], Any]], str]


def changed(imported: Imported, flag: str, changes: dict[str, Change]) -> Imported:
    """`imported` with `changes` made, a row of `flag` for each value that differs. Not validated: flags combine
    (`--target cpu --scale nano`), and only their sum has to be a config the workbook takes (`checked`)."""
    config = flat(imported.config)
    before = dict(config)
    rows, defaults = list(imported.rows), flatten(from_dict({}))
    for key, (new, why) in changes.items():
        old = config.get(key, defaults[key])
        value = new(old, before) if callable(new) else new
        if old != value:
            rows.append(Row(flag, old, f"{key}={value}", why))
            config[key] = value
    return Imported(nested(config), rows, imported.reductions)


def checked(imported: Imported) -> Imported:
    """`imported` once the workbook validates its config (ConfigError, one line, where it does not)."""
    from_dict(imported.config)
    return imported
