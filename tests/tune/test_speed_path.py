"""Which way each variable is measured (helpers/tune/speed_path.py): two processes stepping in turns (every round on
a one-process best), both arms in each rank of one msrun launch (the all-reduce fusion of a data-parallel best), or
whole runs."""
from __future__ import annotations

from helpers.config import all_keys, from_dict
from helpers.tune.speed_path import PAIRED, PROCESSES, RUNS, path_of, speed_path, table


def test_every_config_key_has_a_measurement_path():
    paths = table()
    assert set(paths) == set(all_keys()) and set(paths.values()) <= {PAIRED, PROCESSES, RUNS}
    assert PAIRED not in paths.values()  # pairing inside one process is only for a data-parallel best's ranks
    for key in ("mode", "jit_level", "threads", "device_target", "data.num_parallel_workers", "data.prefetch",
                "memory_optimize", "batch_size", "grad_accum_steps", "model.n_layer", "model.kernels", "amp_level",
                "recompute", "grad_norm", "model.ballast", "model.ballast_every"):
        assert path_of(key) == PROCESSES, key
    for key in ("compile_cache", "parallel.data_parallel", "monitor.profile_steps", "parallel.comm_fusion"):
        assert path_of(key) == RUNS, key


def test_a_round_takes_the_path_of_its_most_demanding_key():
    best = from_dict({})
    path, why = speed_path({"batch_size": 16}, best)
    assert path == PROCESSES and why == "each arm a process of its own, the two taking turns step by step"
    path, why = speed_path({"mode": "pynative", "jit_level": "none"}, best)
    assert path == PROCESSES and "process-wide" in why and "taking turns" in why
    assert speed_path({"threads": 1}, best)[0] == PROCESSES
    assert speed_path({"data.num_parallel_workers": 2}, best)[0] == PROCESSES
    assert speed_path({"compile_cache": False}, best)[0] == RUNS
    dp = from_dict({"parallel": {"data_parallel": 2}, "batch_size": 8})
    assert speed_path({"batch_size": 16}, dp)[0] == RUNS
    path, why = speed_path({"parallel.comm_fusion": "size"}, dp)  # fixed per compiled graph: paired in each rank
    assert path == PAIRED and "msrun launch" in why
    assert speed_path({"parallel.comm_fusion": "size"}, best)[0] == RUNS  # no all-reduce without DP
    profiled = from_dict({"steps": 30, "monitor": {"profile_steps": 10}})  # one profiler, one op table per run
    path, why = speed_path({"model.qkv": "fused_slice"}, profiled)
    assert path == RUNS and "profiled" in why
