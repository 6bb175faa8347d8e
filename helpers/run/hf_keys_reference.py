"""The config.json key table (`hf_config_keys`) as a reference page: per architecture how many keys are honoured,
checked, ignored and refused, each architecture's own keys, and the keys they all share — rendered from the table."""
from __future__ import annotations

from helpers.run.hf_config_keys import ABSENT, ARCHITECTURES, CHECKED, COMMON, FROM_WEIGHTS, HONOURED, IGNORED, \
    REFUSED, Key, show

HOWS = (HONOURED, CHECKED, IGNORED, REFUSED)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|") or " "


def _value(key: Key) -> str:
    """The workbook key an honoured key sets, or the value a checked key must have."""
    if key.how == HONOURED:
        return key.sets
    if key.how != CHECKED:
        return "—"
    return key.assumed if isinstance(key.assumed, str) and key.ok else f"`{show(key.assumed)}`"


def _absent(key: Key) -> str:
    if key.default is FROM_WEIGHTS:
        return "the weights' shape"
    return "—" if key.default is ABSENT else f"`{show(key.default)}`"


def _rows(keys: dict[str, Key]) -> list[str]:
    """One row per run of keys declared alike (the generation defaults, the token ids, …)."""
    groups: list[tuple[list[str], Key]] = []
    for name, key in keys.items():
        if groups and groups[-1][1] == key:
            groups[-1][0].append(name)
        else:
            groups.append(([name], key))
    return [f"| {', '.join(f'`{n}`' for n in names)} | {key.how} | {_cell(_value(key))} | {_cell(_absent(key))} | "
            f"{_cell(key.why)} |" for names, key in groups]


def keys_markdown() -> str:
    """The reference page (Markdown)."""
    head = "| key | treatment | workbook key or value | left out | why |\n|---|---|---|---|---|"
    out = ["# Hugging Face config.json keys", "",
           "What `init_from` (and `hf_weights.model_settings`) does with each key of a checkpoint's `config.json`, "
           "for each `model_type` the workbook imports. A key is *honoured* (it sets the workbook key named), "
           "*checked* (the workbook computes with the value named and refuses any other), *ignored* (why is given) "
           "or *refused*. A key in no table is refused by name. A key left out takes transformers' default, except "
           "the shape-bearing dims, which are read from the weights; a dim config.json states is compared with the "
           "weights' shapes, and a config.json that contradicts its weights is refused naming both. A config.json "
           "that is present and unreadable is refused, never taken as absent.", "",
           "The weights read are the ones transformers reads: a folder's `model.safetensors`, else the shards its "
           "`model.safetensors.index.json` names. Other `.safetensors` files beside them are left out and named in "
           "the run's `init_from.ignored_files`. Only float tensors (F32, F16, BF16) are weights; each is read as "
           "float32, and a NaN or infinity in one is refused naming the tensor and its file. A refusal either names "
           "the settings to change (`set key=value …`, values the config accepts) or says the checkpoint cannot be "
           "imported. The export (`python -m helpers export`) writes every value it honours and the value of each "
           "key it checks.", "",
           "| architecture | `model_type` | tensor layout | keys | " + " | ".join(HOWS) + " |",
           "|---|---|---|---|" + "---|" * len(HOWS)]
    for model_type, arch in ARCHITECTURES.items():
        keys = arch.keys
        counts = [sum(k.how == how for k in keys.values()) for how in HOWS]
        out.append(f"| {arch.name} | `{model_type}` | {arch.layout} | {len(keys)} | "
                   + " | ".join(map(str, counts)) + " |")
    for model_type, arch in ARCHITECTURES.items():
        out += ["", f"## {arch.name} (`model_type: {model_type}`)", "", head, *_rows(arch.own)]
    out += ["", "## Keys every architecture shares", "",
            "transformers' common configuration keys (its 5.x fields and 4.x arguments), the keys its initialiser "
            "takes out of config.json, and the generation defaults older files carry.", "", head, *_rows(COMMON)]
    return "\n".join(out) + "\n"
