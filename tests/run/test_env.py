"""The two peaks behind MFU: the hardware peak's arithmetic, the achievable matmul peak (when it is measured again,
keyed by the model's shapes), and how a run names both; an MFU above either is an error."""
from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest

from helpers.config import from_dict
from helpers.run import peaks
from helpers.run.metrics import summarize
from helpers.record import MetricColumns, load_run
from tests.conftest import run_cli, tiny_args


def _cache(tmp_path, monkeypatch, entry: dict) -> None:
    """A peak cache in a private XDG_CACHE_HOME holding `entry` for this machine's CPU fp32 key (default shapes)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = peaks._cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({peaks._machine_key("CPU", "fp32", 0, peaks.default_shapes()): entry}))


def _at(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - seconds_ago))


def test_a_fresh_quiet_peak_is_used_as_cached(tmp_path, monkeypatch):
    _cache(tmp_path, monkeypatch, {"flops": 123.0, "measured_at": _at(60), "load_avg_1m": 0.1, "others_cores": 0.0,
                                   "method": peaks.PEAK_METHOD})
    info = peaks.peak_flops_info("CPU", "fp32", 0)
    assert info["flops"] == 123.0 and info["source"].startswith("cached: measured")
    assert info["name"].startswith("achievable: MindSpore's fp32 MatMul on CPU, the fastest of the model's shapes")


@pytest.mark.parametrize("entry, why", [
    ({"flops": 1.0, "measured_at": _at(2 * peaks.PEAK_STALE_S), "load_avg_1m": 0.1, "others_cores": 0.0},
     "older than"),
    ({"flops": 1.0, "measured_at": _at(peaks.PEAK_RETRY_S + 60), "load_avg_1m": 0.1, "others_cores": 1.0,
      "method": peaks.PEAK_METHOD}, "measured under load"),
    # written before the other processes' CPU was kept: its 1-min load average (1.03 here) had passed a peak that
    # one other busy process had halved
    ({"flops": 1.0, "measured_at": _at(60), "load_avg_1m": 1.03}, "no record of the CPU other processes used"),
    # timed in 10 ms loops whose calls were counted from the warm-up: they read down to half the peak
    ({"flops": 1.0, "measured_at": _at(60), "load_avg_1m": 0.1, "others_cores": 0.0}, "timed by an earlier method"),
])
def test_a_stale_or_loaded_peak_is_measured_again(tmp_path, monkeypatch, entry, why):
    _cache(tmp_path, monkeypatch, entry)
    info = peaks.peak_flops_info("CPU", "fp32", 0)
    assert info["flops"] > 1e8, info  # real matmuls, not the cached 1 FLOP/s
    assert why in info["source"] and info["measured_at"] != entry["measured_at"]
    assert info["load_avg_1m"] >= 0 and info["others_cores"] >= 0 and info["cores"] == os.cpu_count()
    key = peaks._machine_key("CPU", "fp32", 0, peaks.default_shapes())
    cached = json.loads(peaks._cache_file().read_text())[key]
    assert cached["flops"] == info["flops"] and cached["others_cores"] == info["others_cores"]


def test_a_measurement_lower_than_a_fresh_cached_peak_leaves_it(tmp_path, monkeypatch):
    """The best of several measurements is nearest the peak, across processes as within one: a quiet process read
    82.9 GFLOP/s where the one before it had read 157.8 on the same shapes (make workbook, notebook 05)."""
    high = {"flops": 1e15, "measured_at": _at(peaks.PEAK_RETRY_S + 60), "load_avg_1m": 0.1, "others_cores": 1.0,
            "method": peaks.PEAK_METHOD}
    _cache(tmp_path, monkeypatch, high)  # higher than any real matmul, and measured under load
    info = peaks.peak_flops_info("CPU", "fp32", 0)  # under load, no try for 10 min: measured again
    assert "it read lower" in info["source"] and "so the higher one stays" in info["source"]
    assert info["flops"] == 1e15 and info["loaded"] and info["measured_at"] == high["measured_at"]
    # quiet or not, that try counts: the next run uses the cached peak without timing matmuls again
    again = peaks.peak_flops_info("CPU", "fp32", 0)
    assert again["source"].startswith("cached: measured") and again["flops"] == 1e15
    assert again["tried_at"] == info["tried_at"] != high["measured_at"]


def test_a_loaded_peak_is_tried_again_at_most_every_retry_interval(tmp_path, monkeypatch):
    """Under steady load (a round's two arms, a test suite) every run had timed the matmuls again, 2-10 s each;
    a loaded peak tried within PEAK_RETRY_S is used as it is, and its source says it was measured under load."""
    entry = {"flops": 1.0, "measured_at": _at(2 * peaks.PEAK_RETRY_S), "tried_at": _at(peaks.PEAK_RETRY_S - 60),
             "load_avg_1m": 3.0, "others_cores": 1.0, "method": peaks.PEAK_METHOD}
    _cache(tmp_path, monkeypatch, entry)
    info = peaks.peak_flops_info("CPU", "fp32", 0)
    assert info["flops"] == 1.0 and info["loaded"], info
    assert info["source"] == (f"cached: measured {entry['measured_at']} at load 3.00, other processes 1.00 cores on "
                              f"{os.cpu_count()} cores (under load; tried again at most every 10 min until a try "
                              f"runs quiet)")
    _cache(tmp_path, monkeypatch, {**entry, "tried_at": _at(peaks.PEAK_RETRY_S + 60)})
    assert "no try in the last 10 min ran quiet" in peaks.peak_flops_info("CPU", "fp32", 0)["source"]


def test_other_processes_cpu_is_the_hosts_busy_time_less_this_process_s(monkeypatch):
    """others_cores = (host busy CPU s − this process's CPU s) ÷ wall s: a co-tenant's core counts whatever the
    lagging 1-min load average says, and this process's own threads do not."""
    readings = {"wall": [100.0, 101.0], "busy": [50.0, 51.8], "own": [10.0, 10.9]}  # before, after (s)

    def call():  # the measured work: moves every clock to its "after" reading
        for name in readings:
            readings[name].pop(0)
        return "done"
    monkeypatch.setattr(peaks, "host_busy_s", lambda: readings["busy"][0])
    monkeypatch.setattr(peaks, "time", SimpleNamespace(perf_counter=lambda: readings["wall"][0],
                                                       process_time=lambda: readings["own"][0]))
    assert peaks.others_cores(call) == ("done", 0.9)  # 1.8 s busy − 0.9 s own, in 1 s
    monkeypatch.setattr(peaks, "host_busy_s", lambda: None)  # no /proc/stat: unknown, not zero
    monkeypatch.setattr(peaks, "time", time)
    assert peaks.others_cores(lambda: "done")[1] is None


def test_the_hosts_busy_time_counts_this_process_s_own_cpu():
    before, own, t = peaks.host_busy_s(), time.process_time(), time.perf_counter()
    while time.process_time() - own < 0.3 and time.perf_counter() - t < 10:  # 0.3 s of CPU, however loaded
        pass
    used = time.process_time() - own
    assert used >= 0.3 and peaks.host_busy_s() - before >= 0.8 * used


def test_the_achievable_peak_is_measured_on_the_models_shapes_and_cached_per_shape_set(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    tiny = peaks.matmul_shapes(from_dict({"model": {"preset": "debug"}, "batch_size": 8}), 65)
    assert tiny == [(256, 64, 192), (256, 64, 64), (256, 64, 256), (256, 256, 64), (256, 64, 65)]  # M = 8 × 32
    grouped = {"preset": "debug", "n_kv_head": 1}  # one k,v head of 32: k and v are 32 wide
    assert peaks.matmul_shapes(from_dict({"model": grouped, "batch_size": 8}))[0] == (256, 64, 128)
    assert peaks.matmul_shapes(from_dict({"model": {**grouped, "qkv": "separate"}, "batch_size": 8}))[:2] == [
        (256, 64, 64), (256, 64, 32)]
    info = peaks.peak_flops_info("CPU", "fp32", 0, tiny)
    assert [r["shape"] for r in info["shapes"]] == [list(s) for s in tiny]
    assert info["flops"] == max(r["flops"] for r in info["shapes"]) > 1e8
    other = peaks.peak_flops_info("CPU", "fp32", 0, tiny[:1])  # another model's shapes are another entry
    assert "no peak cached" in other["source"]
    keys = list(json.loads(peaks._cache_file().read_text()))
    assert len(keys) == 2 and keys[0].endswith("256x64x192,256x64x64,256x64x256,256x256x64,256x64x65")


def _product(hw: dict) -> float:
    return hw["cores"] * hw["ghz"] * 1e9 * hw["lanes"] * hw["fma_units"] * 2


def _line(hw: dict, dtype: str = "fp32") -> str:
    return (f"{hw['cores']} cores × {hw['ghz']:.3f} GHz ({hw['clock_source']}) × {hw['lanes']} {dtype} lanes "
            f"({hw['isa']}, {hw['vector_bits']}-bit) × {hw['fma_units']} FMA units per core (assumed) × 2 FLOP per "
            f"FMA = {hw['derived_flops'] / 1e9:.1f} GFLOP/s")


def test_the_hardware_peak_shows_its_arithmetic_and_no_matmul_beats_it(tmp_path, monkeypatch):
    """On this machine: the clock measured (where the native library is built), the arithmetic's product, and a
    1024³ MatMul measured here below the peak: by the rule that raises a peak below a rate the machine reached, and
    so on any host, even where /proc/cpuinfo gives a base clock far below the cores' own (a Xeon's 2.1 GHz)."""
    from helpers.run.kernels import library_problem
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    matmul = peaks.peak_flops_info("CPU", "fp32", 0, [(1024, 1024, 1024)])["flops"]  # cached: a rate reached here
    hw = peaks.hardware_peak("fp32")
    assert hw["derived_flops"] == pytest.approx(_product(hw))
    assert 1 <= hw["cores"] <= os.cpu_count()
    if library_problem() == "":  # the clock is the cores' own, measured, and cached like the matmul peaks
        assert hw["clock_source"].startswith(f"measured: {hw['ghz']:.3f} GHz, a dependent-add loop") and \
            not hw["lower_bound"] and 0.5 < hw["ghz"] < 7.0, hw
        assert peaks.measured_clock()["hz"] == pytest.approx(hw["ghz"] * 1e9)
    if hw["flops"] == hw["derived_flops"]:
        assert hw["arithmetic"] == _line(hw) and hw["derived_flops"] >= matmul
    else:  # the arithmetic came out below the MatMul: the peak is that rate, a lower bound, and says so
        assert hw["flops"] == pytest.approx(matmul) and hw["lower_bound"]
        assert hw["arithmetic"] == (f"{_line(hw)}, below the fp32 MatMul rate this machine reached (measured "
                                    f"{hw['reached']['measured_at']}), so raised to it (a lower bound) = "
                                    f"{matmul / 1e9:.1f} GFLOP/s")
    assert hw["flops"] >= matmul
    assert peaks.hardware_peak("fp32", "GPU") is None  # no derived peak off CPU


def _fake_cpu(monkeypatch, mhz: float, clock_hz: float | None) -> None:
    """Two cores with AVX-512 whose /proc/cpuinfo reads `mhz` and lscpu no max MHz; the native clock loop reads
    `clock_hz` (None: no library, as without a compiler)."""
    flags = "fpu sse2 avx avx2 fma avx512f"
    cpus = [{"processor": str(i), "physical id": "0", "core id": str(i), "cpu MHz": str(mhz), "flags": flags}
            for i in range(2)]
    monkeypatch.setattr(peaks, "_cpuinfo", lambda: cpus)
    monkeypatch.setattr(peaks, "_lscpu", dict)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(peaks, "measure_clock_hz", lambda: clock_hz)


def test_a_base_clock_is_a_lower_bound_and_a_peak_below_a_reached_rate_is_raised_to_it(tmp_path, monkeypatch):
    """On a Xeon VM, /proc/cpuinfo's 2.1 GHz base clock made 268.8 GFLOP/s where MindSpore's MatMul was
    measured at 367.8 on the same host, so MFU read higher against the hardware peak than against the matmul one."""
    _cache(tmp_path, monkeypatch, {"flops": 367.8e9, "measured_at": "2026-12-01T10:00:00"})
    _fake_cpu(monkeypatch, 2100.0, None)
    hw = peaks.hardware_peak("fp32")
    assert hw["derived_flops"] == pytest.approx(268.8e9) and hw["flops"] == pytest.approx(367.8e9)
    assert hw["lower_bound"] and hw["clock_source"] == "lower bound: base clock from /proc/cpuinfo"
    assert hw["arithmetic"] == ("2 cores × 2.100 GHz (lower bound: base clock from /proc/cpuinfo) × 16 fp32 lanes "
                                "(avx512f, 512-bit) × 2 FMA units per core (assumed) × 2 FLOP per FMA = 268.8 "
                                "GFLOP/s, below the fp32 MatMul rate this machine reached (measured "
                                "2026-12-01T10:00:00), so raised to it (a lower bound) = 367.8 GFLOP/s")
    # a summary carries the label beside the arithmetic; its MFU against the hardware peak stays below the other
    keys = peaks.peak_summary({"flops": 367.8e9}, hw)
    assert keys["peak_flops_hardware_lower_bound"] is True and keys["peak_flops_hardware_arithmetic"].endswith(
        "= 367.8 GFLOP/s")
    # a faster dtype's rate does not raise the fp32 peak; fp32's does raise a narrower dtype's (never below fp32's)
    path = peaks._cache_file()
    path.write_text(json.dumps({peaks._machine_key("CPU", "fp16", 0, [(8, 8, 8)]): {"flops": 900e9},
                                peaks._machine_key("CPU", "fp32", 1, [(8, 8, 8)]): {"flops": 300e9},
                                "other-host|x|2|CPU|fp32|default|2.10.0|8x8x8": {"flops": 1e15}}))
    assert peaks.hardware_peak("fp32")["flops"] == pytest.approx(300e9)
    assert peaks.hardware_peak("fp16")["reached"]["flops"] == pytest.approx(900e9)
    # with no rate reached the base clock's product stands, named a lower bound in its arithmetic and its field
    path.write_text("{}")
    hw = peaks.hardware_peak("fp32")
    assert (hw["flops"], hw["lower_bound"], hw["reached"]) == (pytest.approx(268.8e9), True, None)
    assert hw["arithmetic"] == _line(hw) and "lower bound: base clock" in hw["arithmetic"]


def test_a_measured_clock_is_used_and_cached(tmp_path, monkeypatch):
    """The same host with the native library: the cores' own clock (here 3.9 GHz) makes the peak, above the rate
    reached, and the next process reads the clock from the cache without timing it again."""
    _cache(tmp_path, monkeypatch, {"flops": 367.8e9, "measured_at": "2026-12-01T10:00:00"})
    _fake_cpu(monkeypatch, 2100.0, 3.9e9)
    hw = peaks.hardware_peak("fp32")
    assert (hw["flops"], hw["lower_bound"]) == (pytest.approx(499.2e9), False)
    assert hw["clock_source"] == "measured: 3.900 GHz, a dependent-add loop's cycles a second; /proc/cpuinfo reads " \
                                 "2.100 GHz"
    assert hw["arithmetic"] == _line(hw) and hw["arithmetic"].endswith("= 499.2 GFLOP/s")
    assert peaks.peak_summary({}, hw)["peak_flops_hardware_lower_bound"] is False
    monkeypatch.setattr(peaks, "measure_clock_hz", lambda: pytest.fail("the cached clock was measured again"))
    assert peaks.hardware_peak("fp32")["ghz"] == pytest.approx(3.9)
    key = "|".join(peaks._machine_prefix())
    clock = json.loads(peaks._clock_cache_file().read_text())[key]
    assert clock["hz"] == 3.9e9 and clock["method"] == peaks.CLOCK_METHOD
    # a day later it is measured again
    peaks._clock_cache_file().write_text(json.dumps({key: {**clock, "measured_at": _at(2 * peaks.PEAK_STALE_S)}}))
    monkeypatch.setattr(peaks, "measure_clock_hz", lambda: 4.0e9)
    assert peaks.hardware_peak("fp32")["ghz"] == pytest.approx(4.0)


def test_the_native_clock_loop_reads_the_cores_clock_in_well_under_a_second():
    from helpers.run.kernels import library_problem
    if library_problem():
        pytest.skip(f"no native library: {library_problem()}")
    t0 = time.perf_counter()
    hz = peaks.measure_clock_hz()
    assert time.perf_counter() - t0 < 0.8 and 0.5e9 < hz < 7e9


def _rows(tokens_per_s: float, steps: int = 6) -> MetricColumns:
    return MetricColumns.of_rows([{"step": s, "step_time_ms": 1000.0 * 100 / tokens_per_s, "data_wait_ms": 0.0,
                                   "tokens": 100} for s in range(1, steps + 1)])


def test_an_mfu_above_either_peak_is_an_error():
    ok = summarize(_rows(1000.0), 1, 1, 1e6, peak_flops=2e9, hardware_peak_flops=4e9)
    assert (ok["mfu"], ok["mfu_hardware"], ok["mfu_error"]) == (pytest.approx(0.5), pytest.approx(0.25), None)
    low = summarize(_rows(1000.0), 1, 1, 1e6, peak_flops=5e8, hardware_peak_flops=4e9)
    assert low["mfu_error"] == ("MFU above 100% (200.0% of the achievable matmul peak): that peak is too low to "
                                "divide by")
    both = summarize(_rows(1000.0), 1, 1, 1e6, peak_flops=5e8, hardware_peak_flops=8e8)
    assert "200.0% of the achievable matmul peak, 125.0% of the hardware peak" in both["mfu_error"]


def test_summary_and_show_name_both_peaks_and_mfu_stays_below_them(tmp_path, small_corpus):
    run = tmp_path / "run"
    assert run_cli("train", *tiny_args(small_corpus, 12), "--out", str(run), "--progress", "none").returncode == 0
    s = load_run(run).summary
    assert 0 < s["mfu"] <= 1 and 0 < s["mfu_hardware"] <= 1 and s["mfu_error"] is None, s
    assert s["peak_flops"] <= s["peak_flops_hardware"]
    assert s["peak_flops_name"].startswith("achievable: MindSpore's fp32 MatMul on CPU")
    assert [r["shape"][0] for r in s["peak_flops_shapes"]] == [8 * 32] * len(s["peak_flops_shapes"])
    assert s["peak_flops_hardware_arithmetic"].endswith(f"= {s['peak_flops_hardware'] / 1e9:.1f} GFLOP/s")
    assert isinstance(s["peak_flops_hardware_lower_bound"], bool)
    assert s["peak_flops_measured_at"] and s["peak_flops_load_avg"] is not None
    assert s["peak_flops_source"].startswith(("cached: measured", "measured now at load"))
    shown = run_cli("show", str(run)).stdout
    for key in ("peak_flops_name", "peak_flops_measured_at", "peak_flops_load_avg", "mfu_hardware",
                "peak_flops_hardware_arithmetic"):
        assert key in shown


@pytest.mark.slow
def test_a_run_that_beats_its_cached_peak_measures_the_peak_again(tmp_path, small_corpus, monkeypatch):
    """A peak cached low (measured while something else ran) read MFU 144% in make workbook; the run that beats
    it measures the peak again and divides by the higher one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    args = tiny_args(small_corpus, 12)
    assert run_cli("train", *args, "--out", str(tmp_path / "first"), "--progress", "none").returncode == 0
    cache = peaks._cache_file()  # the matmul peaks (the measured clock is in core_clock.json beside it)
    entries = json.loads(cache.read_text())
    for entry in entries.values():  # measured low, yet fresh and quiet by its record: the cache serves it as is
        entry.update(flops=1e6, load_avg_1m=0.0, others_cores=0.0, method=peaks.PEAK_METHOD,
                     measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
    cache.write_text(json.dumps(entries))
    assert run_cli("train", *args, "--out", str(tmp_path / "second"), "--progress", "none").returncode == 0
    s = load_run(tmp_path / "second").summary
    assert 0 < s["mfu"] <= 1 and s["mfu_error"] is None and s["peak_flops"] > 1e6, s
    assert s["peak_flops_remeasured"].startswith("MFU read ") and "measured again after the run" in \
        s["peak_flops_remeasured"]
    assert s["peak_flops_source"].startswith("measured now at load") and "refresh requested" in s["peak_flops_source"]
    assert all(e["flops"] > 1e6 for e in json.loads(cache.read_text()).values())  # the cache holds it now
