"""The lever registry (helpers/levers.py) is the one declaration of each config key for rounds: every key is
declared (a new key fails here instead of taking a default in speed_path, startup, convergence or round_spec), and
the modules that ask read their answers from it."""
from __future__ import annotations

from helpers.config import all_keys
from helpers.levers import LEVERS, PER_GRAPH, PROCESSES, RUNS, keys_where
from helpers.run import startup
from helpers.tune import convergence, round_spec, speed_path


def test_every_config_key_is_declared_once_and_nothing_else_is():
    assert sorted(LEVERS) == sorted(all_keys())
    assert {lever.measured for lever in LEVERS.values()} <= {PROCESSES, RUNS, PER_GRAPH}


def test_the_modules_that_ask_read_the_registry():
    assert {k for k in all_keys() if speed_path.path_of(k) == RUNS} == set(keys_where(measured=RUNS)) | \
        set(keys_where(measured=PER_GRAPH))
    assert startup._NOT_IN_GRAPH == frozenset(k for k, lever in LEVERS.items() if not lever.in_graph)
    assert set(convergence.CONVERGENCE_VARIABLES) == {k for k, lever in LEVERS.items() if lever.learning}
    assert set(convergence.RECIPE) == {k for k, lever in LEVERS.items() if lever.recipe}
    assert round_spec.FIXED == ("steps", "seed", "steady_after", "resume_from")


def test_what_each_answer_was_before_the_registry_still_holds():
    """A spot check of each kind, as the modules answered when each kept its own list."""
    assert speed_path._why("data.prefetch")[0] == PROCESSES and "dataset engine" in speed_path._why("data.prefetch")[1]
    assert speed_path._why("mode") == (PROCESSES, "the execution mode is process-wide (ms.set_context)")
    assert speed_path._why("compile_cache")[0] == RUNS and speed_path._why("parallel.comm_fusion")[0] == RUNS
    assert speed_path._why("model.n_layer") == (PROCESSES, "")
    assert {"lr", "steps", "data.corpus", "monitor.profile_steps"} <= startup._NOT_IN_GRAPH
    assert not {"model.n_layer", "batch_size", "seed", "data.tokenizer"} & startup._NOT_IN_GRAPH
    assert "model.dropout" in convergence.CONVERGENCE_VARIABLES and "batch_size" not in convergence.CONVERGENCE_VARIABLES
    assert set(convergence.RECIPE) == {"lr", "warmup", "warmup_ratio", "steps", "schedule", "cooldown_frac", "min_lr",
                                       "batch_size", "grad_accum_steps"}


def test_each_tuner_family_declares_its_keys_and_every_candidate_keeps_to_them():
    import pytest

    from helpers.levers import FAMILIES, SPEED_FAMILIES, families_of
    from helpers.tune import autotune, ttq_levers
    from helpers.tune.autotune import Candidate, candidates
    from helpers.tune.diagnose import Diagnosis
    from helpers.tune.study import base_config
    from helpers.tune.ttq_search import recipe_arms
    assert {k for keys in FAMILIES.values() for k in keys} <= set(LEVERS)
    assert autotune.FAMILIES == tuple(SPEED_FAMILIES)
    with pytest.raises(ValueError, match="changes threads, which helpers/levers.py does not declare"):
        Candidate("sneaky", "data", {"threads": 1}, "")
    made = []
    for changes in ({}, {"mode": "pynative", "batch_size": 16, "threads": 1}, {"grad_accum_steps": 2}):
        cfg = base_config(changes=changes)
        for verdict in ("data-bound", "compute-bound", "memory-bound", "communication-bound", "balanced"):
            made += candidates(cfg, Diagnosis(verdict, [], {}, {}, [], []), cores=2)[0]
        made += recipe_arms(cfg) + ttq_levers.lever_arms(cfg)
    assert set(FAMILIES) - {c.family for c in made} <= {"data_parallel"}  # every family offers candidates here
    assert all(c.family in families_of(k) for c in made for k in c.changes)


def test_every_key_the_mindformers_import_sets_is_a_declared_lever():
    from helpers.mindformers.reference import keys_by_lever
    set_by_import = keys_by_lever()
    markers = {k for k in set_by_import if k.startswith("(") or k.endswith("*")}  # checked-only, schema, families
    assert set(set_by_import) - markers <= set(LEVERS)
    assert set_by_import["model.n_layer"] == ["num_layers", "num_hidden_layers"]
    assert "recompute_config.recompute" in set_by_import["recompute"]
