"""The mapping table as a reference page: every MindFormers key the import knows, the workbook key it sets (or why
it means nothing here), and the MindFormers defaults it takes — rendered from the key tables themselves."""
from __future__ import annotations

from helpers.mindformers.defaults import THEIR_DEFAULTS
from helpers.mindformers.ignored import IGNORED_KEYS, IGNORED_SECTIONS
from helpers.mindformers.importer import FEEDS
from helpers.mindformers.model_keys import ARCH_KEYS, FAMILIES, M, MODEL_KEYS, MODEL_SECTIONS, MODEL_TYPES
from helpers.mindformers.run_keys import RUN_KEYS, SCHEDULES
from helpers.mindformers.values import Refused

_SAMPLES = (1, 2, True, "float32", "rope", "LlamaConfig", "llama", "CosineWithWarmUpLR", "AdamW", [0.9, 0.95],
            "train", "PI", "silu", "MindDataset", "x")


_SCHEDULE_NAMES = {"mf.polynomial": "linear (power 1; other powers refused)"}


def _target(convert) -> str:
    """The workbook keys a converter sets, found by trying sample values; '—' when it only checks."""
    for sample in _SAMPLES:
        try:
            got = convert(sample)
        except (Refused, TypeError, ValueError, KeyError, AttributeError):
            continue
        if got:
            return ", ".join(sorted({FEEDS.get(k, k) for k in got}))
    return "—"


def keys_by_lever() -> dict[str, list[str]]:
    """Each workbook key the import sets and the MindFormers keys that set it (model keys without their
    `model.model_config.` prefix), in the tables' order; markers such as '(checked)' for keys that set nothing."""
    out: dict[str, list[str]] = {}
    for table in (MODEL_KEYS, ARCH_KEYS, RUN_KEYS):
        for key, (convert, _) in table.items():
            for ours in _target(convert).split(", "):
                if ours != "—":
                    out.setdefault(ours, []).append(key)
    return out


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|") or " "


def mapping_markdown() -> str:
    """The reference page (Markdown): model keys of both schemas, training keys, keys and sections with no meaning
    here, the families and schedules mapped, and MindFormers' defaults taken where they differ."""
    out = ["# MindFormers keys", "",
           "What `python -m helpers import-config` does with each key of a MindFormers YAML (generated from "
           "`helpers/mindformers/`). A key in no table is refused with a suggestion; every refusal of a recipe is "
           "reported at once. *checked* keys set nothing and are refused at values the workbook cannot honour.", "",
           "## Model (`model.model_config.*`, legacy and mcore names)", "", "| key | workbook key | how / why |",
           "|---|---|---|"]
    out += [f"| `{k}` | {_cell(_target(c))} | {_cell(n)} |" for k, (c, n) in sorted(MODEL_KEYS.items())]
    out += [f"| `{k}` | {_cell(_target(c))} | {_cell(n)} |" for k, (c, n) in ARCH_KEYS.items()]
    out += [f"| `{M}{k}.*` | — | {_cell(why)} (refused) |" for k, why in MODEL_SECTIONS.items()]
    out += ["", "## Training, parallel layout, data, context", "", "| key | workbook key | how / why |", "|---|---|---|"]
    out += [f"| `{k}` | {_cell(_target(c))} | {_cell(n)} |" for k, (c, n) in sorted(RUN_KEYS.items())]
    out += ["", "## No meaning here", "", "| key or section | why |", "|---|---|"]
    out += [f"| `{k}` | {_cell(why)} |" for k, why in sorted({**IGNORED_KEYS, **{f"{s}.*": w for s, w in
                                                                                 IGNORED_SECTIONS.items()}}.items())]
    out += ["", "## Families and schedules", "",
            f"Legacy `model_config.type`: {', '.join(f'`{k}`' for k in FAMILIES)}. "
            f"mcore `model_type`: {', '.join(f'`{k}`' for k in MODEL_TYPES)}. "
            f"`lr_schedule.type`: {', '.join(f'`{k}` → {_SCHEDULE_NAMES.get(v, v)}' for k, v in SCHEDULES.items())}.",
            "", "## MindFormers' defaults the import takes", "", "| left out | workbook key | why |",
            "|---|---|---|"]
    out += [f"| `{d.source}` | {d.ours} | {_cell(d.why)} |" for d in THEIR_DEFAULTS]
    return "\n".join(out) + "\n"
