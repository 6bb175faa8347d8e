"""The mapping table covers what real MindFormers recipes contain: every key of the causal-LM recipes of
mindformers master and v1.5.0 (tests/data/mindformers_keys_seen.txt) is mapped or noted, none unknown; and the
reference page lists every key the import knows."""
from __future__ import annotations

from helpers.mindformers.importer import _convert
from helpers.mindformers.model_keys import MODEL_KEYS
from helpers.mindformers.reference import mapping_markdown
from helpers.mindformers.run_keys import RUN_KEYS
from tests.conftest import REPO

SEEN = REPO / "tests" / "data" / "mindformers_keys_seen.txt"


def test_every_key_real_recipes_carry_is_in_a_table():
    keys = [k for k in SEEN.read_text(encoding="utf-8").splitlines() if k and not k.startswith("#")]
    assert len(keys) > 350
    unknown = [k for k in keys if (r := _convert(k, None)[2]) is not None and "not a key the import knows" in r.why]
    assert unknown == []


def test_a_key_nobody_mapped_is_still_refused_with_a_suggestion():
    refusal = _convert("model.model_config.num_hiden_layers", 4)[2]
    assert refusal is not None and "did you mean 'model.model_config.num_hidden_layers'?" in refusal.why


def test_the_reference_page_lists_every_key_the_import_knows():
    page = mapping_markdown()
    assert all(f"`{k}`" in page for k in MODEL_KEYS) and all(f"`{k}`" in page for k in RUN_KEYS)
    assert "| `optimizer.weight_decay` | weight_decay | MindFormers' AdamW default" in page
