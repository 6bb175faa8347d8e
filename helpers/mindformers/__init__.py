"""A MindSpore Transformers (MindFormers) training YAML mapped onto the workbook's config
(`python -m helpers import-config`).

Both schemas come in: the legacy one (`model.model_config.type: LlamaConfig`, `num_layers`, `MindDataset`) and the
mcore one (`use_legacy: False`, Hugging Face names, `BlendedMegatronDatasetDataLoader`). The mapping is data: each
source key has a converter and a note (`model_keys`, `run_keys`) or a reason it means nothing here (`ignored`);
where MindFormers' default differs from the workbook's the import takes theirs (`defaults`). Everything that cannot
be honoured is reported at once; `scaled` keeps the recipe and shrinks the dims to a preset for a CPU try-out,
`on_cpu` keeps its size and moves it onto this machine's CPU (`--target cpu`), `adapt` combines the two.
"""
from helpers.mindformers.files import config_yaml, read_yaml
from helpers.mindformers.importer import (Imported, RecipeRefused, Refusal, Row, flat, import_mindformers, leaves,
                                         nested)
from helpers.mindformers.target import on_cpu
from helpers.mindformers.tryout import adapt, scaled

__all__ = ["Imported", "RecipeRefused", "Refusal", "Row", "adapt", "config_yaml", "flat", "import_mindformers", "leaves",
           "nested", "on_cpu", "read_yaml", "scaled"]
