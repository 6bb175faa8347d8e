"""Reading a MindFormers YAML and writing the imported workbook YAML."""
from __future__ import annotations

from helpers.bounded_yaml import YamlRefused, load_file
from helpers.config import ConfigError
from helpers.mindformers.importer import Imported


def read_yaml(path: str) -> dict:
    """A MindFormers YAML file as a dict; one ConfigError line when it is missing, not YAML, or past a bound of
    helpers.bounded_yaml (size, nesting, aliases, a duplicated key)."""
    import yaml
    try:
        return load_file(path) or {}
    except IsADirectoryError:
        raise ConfigError(f"{path!r} is a folder; pass a MindFormers YAML file") from None
    except YamlRefused as exc:
        raise ConfigError(f"{path!r} {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path!r} ({exc.strerror}); pass a MindFormers YAML file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path!r} is not valid YAML{where}; fix its syntax") from None


def config_yaml(imported: Imported, source: str, flags: str = "") -> str:
    """The workbook YAML of an import, headed by where it came from and the flags it was imported with
    ('--target cpu --scale nano')."""
    import yaml
    how = f" {flags}" if flags else ""
    return (f"# Imported from {source} by `python -m helpers import-config{how}` (the same command prints the "
            f"mapping table).\n" + yaml.safe_dump(imported.config, sort_keys=False))
