"""A MindFormers YAML (either schema) mapped onto a validated workbook config, with a table row for every source
key and one report of everything that cannot be honoured."""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.config import ConfigError, from_dict
from helpers.mindformers.defaults import missing_defaults
from helpers.mindformers.derive import derive
from helpers.mindformers.ignored import IGNORED_KEYS, IGNORED_SECTIONS
from helpers.mindformers.model_keys import ARCH_KEYS, M, MODEL_KEYS, MODEL_SECTIONS, arch_class, pet_type, quantized
from helpers.mindformers.run_keys import RUN_KEYS, grouped_lr
from helpers.mindformers.values import Refused

# Intermediate keys (mf.*) → the workbook key they end up setting, for the table's "workbook key" column.
FEEDS = {"mf.batch_size": "batch_size", "mf.beta1": "betas", "mf.beta2": "betas", "mf.optimizer_lr": "lr",
         "mf.use_clip_grad": "max_grad_norm", "mf.max_grad_norm": "max_grad_norm", "mf.dataset_dir": "data.corpus",
         "mf.workers": "data.num_parallel_workers", "mf.multiple_of": "model.mlp_hidden",
         "mf.ffn_dim_multiplier": "model.mlp_hidden", "mf.expand_ratio": "model.mlp_hidden",
         "mf.mqa": "model.n_kv_head", "mf.mqa_groups": "model.n_kv_head", "mf.rope_ratio": "model.rope_theta",
         "mf.hidden_act": "model.mlp", "mf.head_dim": "(checked)", "mf.extend_method": "model.rope_scaling",
         "mf.scaling_factor": "model.rope_scaling_factor", "mf.do_eval": "eval_every", "mf.eval_steps": "eval_every",
         "mf.finetune": "init_from", "mf.pretrained_dir": "model.*", "mf.loader": "data.format",
         "mf.polynomial": "schedule", "mf.power": "schedule", "mf.mcore": "(schema)", "mf.fixed_scale": "loss_scale",
         "mf.family": "model.mlp", "mf.rotary_fraction": "(checked)"}
# Whole sections converted as one value.
SECTION_RULES = {"grouped_lr_schedule": grouped_lr, f"{M}quantization_config": quantized}
# A report of refusals stays bounded however many keys a file holds: a close-match search costs ~1 ms a key (10 min
# for 600k unknown keys), and past a few dozen refusals the file is the wrong one, not a recipe with typos.
HINTED_REFUSALS = 20  # refusals searched for a "did you mean"
LISTED_REFUSALS = 100  # refusals the report lists; it counts the rest


@dataclass(frozen=True)
class Row:
    """One line of the mapping table: a source key and its value, the workbook key(s) it set (or "not used
    here"), and how it maps or why it is not used."""
    source: str
    value: Any
    ours: str
    note: str


@dataclass(frozen=True)
class Refusal:
    """A key whose value cannot be honoured: why and what to do; `reduced` is what --scale does instead."""
    source: str
    value: Any
    why: str
    reduced: str = ""

    def line(self) -> str:
        """'key=value: why' (one line)."""
        return f"{self.source}={_short(self.value)}: {self.why}"


class RecipeRefused(ConfigError):
    """The report of a recipe that cannot be imported: its message lists every refusal; `refusals` holds them."""

    def __init__(self, message: str, refusals: list[Refusal]):
        super().__init__(message)
        self.refusals = refusals


@dataclass
class Imported:
    """A MindFormers YAML mapped: the workbook config (nested, as its YAML), the mapping table, and the
    reductions --scale took for what cannot run at full size here."""
    config: dict
    rows: list[Row]
    reductions: list[Refusal] = field(default_factory=list)

    def table(self) -> str:
        """The mapping table as aligned text, one source key per line."""
        cells = [("source key", "value", "workbook key", "how / why")]
        cells += [(r.source, _short(r.value), r.ours, r.note) for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(3)]
        return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip() for a, b, c, d in cells)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _rule(key: str):
    """(converter, note) for a source key, or None when no table names it."""
    if key in RUN_KEYS:
        return RUN_KEYS[key]
    if key in ARCH_KEYS:
        return ARCH_KEYS[key]
    if key.startswith(M) and key[len(M):] in MODEL_KEYS:
        return MODEL_KEYS[key[len(M):]]
    if key == f"{M}pet_config.pet_type":
        return pet_type, "parameter-efficient fine-tuning"
    if key in SECTION_RULES:
        return SECTION_RULES[key], ""
    return None


def _ignored_why(key: str) -> str | None:
    if key in IGNORED_KEYS:
        return IGNORED_KEYS[key]
    sections = {**IGNORED_SECTIONS, **{f"{M}{k}": v for k, v in MODEL_SECTIONS.items()}}
    return next((why for section, why in sections.items() if key == section or key.startswith(section + ".")), None)


def _inner_keys() -> list[str]:
    return [*RUN_KEYS, *ARCH_KEYS, *(M + k for k in MODEL_KEYS), f"{M}pet_config.pet_type"]


def _whole(dotted: str) -> bool:
    """A key whose value is read as one: a setting whose value may be a mapping, or a section ignored whole. A
    mapping with keys of its own in a table is opened instead (moe_config.expert_num is checked)."""
    if any(k.startswith(dotted + ".") for k in _inner_keys()):
        return False
    return dotted in SECTION_RULES or dotted in IGNORED_KEYS or dotted in IGNORED_SECTIONS or _rule(dotted) is not None


def leaves(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every setting; lists, mapping-valued settings and ignored sections stay whole."""
    out = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if value is None and any(k.startswith(dotted + ".") for k in _inner_keys()):
            continue  # an empty section (`arch:` with nothing under it)
        if isinstance(value, dict) and value and not _whole(dotted):
            out += leaves(value, dotted + ".")
        else:
            out.append((dotted, value))
    return out


def _architecture_refusal(data: dict) -> Refusal | None:
    """A recipe for something other than a causal LM: its other keys have no meaning to check."""
    model = data.get("model") or {}
    config = model.get("model_config") or {}
    for key, value, check in ((f"{M}type", config.get("type"), MODEL_KEYS["type"][0]),
                              (f"{M}model_type", config.get("model_type"), MODEL_KEYS["model_type"][0]),
                              ("model.arch.type", (model.get("arch") or {}).get("type"), arch_class)):
        if value is None:
            continue
        try:
            check(value)
        except Refused as exc:
            return Refusal(key, value, exc.why)
    return None


def _convert(key: str, value: Any, suggest: bool = True) -> tuple[dict, Row | None, Refusal | None]:
    """What one source key sets and its row, or its refusal; with `suggest` an unknown key's refusal names the
    closest known key."""
    rule = _rule(key)
    if rule is None:
        why = _ignored_why(key)
        if why is not None:
            return {}, Row(key, value, "not used here", why), None
        close = []
        if suggest:
            known = [*RUN_KEYS, *(M + k for k in MODEL_KEYS), *IGNORED_KEYS, *IGNORED_SECTIONS]
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return {}, None, Refusal(key, value, f"not a key the import knows; {hint}fix or remove it (the mapped keys "
                                             f"are in helpers/mindformers/)")
    convert, note = rule
    try:
        got = convert(value)
    except Refused as exc:
        return {}, None, Refusal(key, value, exc.why, exc.reduced)
    except (TypeError, ValueError):
        return {}, None, Refusal(key, value, "not a value the import can read for this key; fix it")
    ours = sorted({FEEDS.get(k, k) for k in got})
    return got, Row(key, value, ", ".join(ours) or "not used here", note or ("" if ours else "at its no-op value")), None


def _pretrained_config(folder: Any) -> dict | None:
    """config.json of a local Hugging Face folder (mcore's pretrained_model_dir), or None when it is not here."""
    path = Path(str(folder)) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def import_mindformers(data: dict, reduce: bool = False, source: str = "the recipe") -> Imported:
    """Map a MindFormers YAML (loaded as a dict) onto a validated workbook config.

    Every key that cannot be honoured is collected; ConfigError then lists them all, one line each with why and
    what to do. With `reduce` (what `--scale` asks for) a refusal that only concerns the full-size model or its
    parallel layout (mixture of experts, tensor/pipeline parallel, …) becomes a reduction in the table instead."""
    if not isinstance(data, dict):
        raise ConfigError("a MindFormers YAML must be a mapping of sections (model, runner_config, …)")
    arch = _architecture_refusal(data)
    if arch is not None:
        raise RecipeRefused(f"{source} cannot be imported: {arch.line()} (its other keys were not checked)", [arch])
    raw, rows, refusals = {}, [], []
    items = leaves(data)
    hf = _pretrained_config(data["pretrained_model_dir"]) if data.get("pretrained_model_dir") else None
    if hf is not None:
        in_yaml = {k for k, _ in items}
        items += [(f"{M}{k}", v) for k, v in leaves(hf) if f"{M}{k}" not in in_yaml and k in MODEL_KEYS]
    family: dict = {}  # what the family implies; any key the recipe sets itself wins
    for key, value in items:
        got, row, refusal = _convert(key, value, suggest=len(refusals) < HINTED_REFUSALS)
        (family if key in (f"{M}type", f"{M}model_type") else raw).update(got)
        rows.append(row) if row else refusals.append(refusal)
    raw = {**family, **raw}
    for default, value in missing_defaults(data, {k for k, _ in items}):
        raw[default.ours] = value
        rows.append(Row(f"{default.source} (absent)", value, default.ours, default.why))
    settings, notes, later = derive(raw, hf_found=hf is not None)
    rows += [Row(*n) for n in notes]
    refusals += [Refusal(*r) for r in later]
    hard = [r for r in refusals if not (reduce and r.reduced)]
    if hard:
        shown = [r.line() for r in hard[:LISTED_REFUSALS]]
        if len(hard) > LISTED_REFUSALS:
            shown.append(f"… and {len(hard) - LISTED_REFUSALS:,} more")
        lines = shown[0] if len(hard) == 1 else "\n" + "\n".join(f"  - {line}" for line in shown)
        raise RecipeRefused(f"{source}: {len(hard)} key{'s' * (len(hard) > 1)} cannot be honoured here (nothing "
                            f"written): {lines}", hard)
    reductions = [r for r in refusals if r.reduced]
    rows += [Row(r.source, r.value, f"--scale: {r.reduced}", r.why) for r in reductions]
    config = nested(dict(sorted(settings.items())))
    try:
        from_dict(config)
    except ConfigError as exc:
        raise RecipeRefused(f"{source} maps onto a config the workbook refuses: {exc}",
                            [Refusal("(the imported config)", "", str(exc))]) from None
    return Imported(config, rows, reductions)


def nested(flat: dict) -> dict:
    """{'model.n_layer': 4, 'lr': 1e-3} → {'model': {'n_layer': 4}, 'lr': 1e-3} (the config YAML's shape)."""
    out: dict = {}
    for key, value in flat.items():
        head, _, tail = key.partition(".")
        if tail:
            out.setdefault(head, {})[tail] = value
        else:
            out[key] = value
    return out


def flat(config: dict) -> dict:
    """The inverse of `nested`: {'model': {'n_layer': 4}} → {'model.n_layer': 4}."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out
