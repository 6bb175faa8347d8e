"""The two peaks MFU is divided by, each named: the CPU's hardware peak (cores × clock × vector lanes × FMA units × 2,
arithmetic shown) and the achievable matmul peak (MindSpore's MatMul measured in the run's dtype over the model's
own shapes, cached per machine). FLOP/s throughout."""
from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from helpers.config import Config
from helpers.run.env import cpu_model

T = TypeVar("T")

# ------------------------------------------------------------------------------------------- hardware peak

# Vector FMA pipes per core. Not in /proc/cpuinfo: 2 on Intel cores since Haswell and AMD cores since Zen 2 (fewer on
# some older or smaller parts), so this is an upper bound for those: an MFU against it is never flattered.
FMA_UNITS = 2
VECTOR_BITS = (("avx512f", 512), ("avx2", 256), ("avx", 256), ("sse2", 128))  # widest vector unit the flags show
# A dtype computes in its own lanes only where the CPU has vector FMA for it; otherwise in fp32 lanes.
NARROW_LANE_FLAG = {"fp16": "avx512_fp16", "bf16": "avx512_bf16"}


def _cpuinfo() -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per logical CPU ([] where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    cpus = []
    for block in text.strip().split("\n\n"):
        fields = dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in block.splitlines()))
        if "processor" in fields:
            cpus.append(fields)
    return cpus


def _lscpu() -> dict[str, str]:
    """lscpu's fields ({} without lscpu)."""
    if not shutil.which("lscpu"):
        return {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}


def hardware_peak(dtype: str = "fp32", device_target: str = "CPU") -> dict | None:
    """The CPU's peak FLOP/s for `dtype`, from the cores this process may run on, their clock and vector width, and
    never below a MatMul rate this machine reached.

    Returns {flops, arithmetic (the multiplication as one line), cores, ghz, clock_source, isa, vector_bits, lanes,
    fma_units, derived_flops (the product), lower_bound, reached (the fastest cached MatMul rate of this machine in
    `dtype` or fp32: {flops, dtype, measured_at}, None if none)}; None off CPU (a GPU's or NPU's peak is not derived
    here) or without /proc/cpuinfo.
    cores: physical cores among the CPUs in this process's affinity mask (hyper-thread siblings share FMA units);
    clock: measured (`measured_clock`: the native library's dependent-add loop, cached a day), else lscpu's "CPU max
    MHz" (the highest the cores run at), else the highest /proc/cpuinfo "cpu MHz", which is a lower bound (in a VM
    the base clock: a 2-core Xeon VM's read 2.6 GHz where its cores ran at 4.09). Where the product is below a rate
    this machine reached, the peak is that rate and a lower bound (`lower_bound`, as with the /proc/cpuinfo clock),
    and its arithmetic says so.
    """
    cpus = _cpuinfo()
    if device_target != "CPU" or not cpus:
        return None
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else {int(c["processor"]) for c in cpus}
    mine = [c for c in cpus if int(c["processor"]) in usable] or cpus
    ids = {(c.get("physical id"), c.get("core id")) for c in mine}
    cores = len(ids) if None not in {i for pair in ids for i in pair} else len(mine)
    lscpu = _lscpu()
    listed = max(float(c.get("cpu MHz", 0) or 0) for c in mine)
    clock = measured_clock()
    if clock:
        mhz, lower_bound = clock["hz"] / 1e6, False
        clock_source = f"measured: {mhz / 1000:.3f} GHz, {CLOCK_HOW}; /proc/cpuinfo reads {listed / 1000:.3f} GHz"
    elif lscpu.get("CPU max MHz"):
        mhz, clock_source, lower_bound = float(lscpu["CPU max MHz"]), "lscpu CPU max MHz", False
    else:
        mhz, clock_source, lower_bound = listed, "lower bound: base clock from /proc/cpuinfo", True
    flags = set(mine[0].get("flags", "").split())
    isa, bits = next(((name, b) for name, b in VECTOR_BITS if name in flags), ("scalar", 32))
    narrow = NARROW_LANE_FLAG.get(dtype)
    lane_bits = 16 if narrow and narrow in flags else 32
    lanes = bits // lane_bits
    derived = cores * mhz * 1e6 * lanes * FMA_UNITS * 2
    lane_note = f"{lanes} {dtype} lanes ({isa}, {bits}-bit)" if lane_bits == 16 or dtype == "fp32" else \
        f"{lanes} fp32 lanes ({isa}, {bits}-bit; {dtype} computes in fp32 lanes: no {narrow})"
    arithmetic = (f"{cores} cores × {mhz / 1000:.3f} GHz ({clock_source}) × {lane_note} × "
                  f"{FMA_UNITS} FMA units per core (assumed) × 2 FLOP per FMA = {derived / 1e9:.1f} GFLOP/s")
    flops, reached = derived, reached_rate(dtype, device_target)
    if reached and reached["flops"] > derived:
        flops, lower_bound = reached["flops"], True
        arithmetic += (f", below the {reached['dtype']} MatMul rate this machine reached (measured "
                       f"{reached['measured_at']}), so raised to it (a lower bound) = {flops / 1e9:.1f} GFLOP/s")
    return {"flops": flops, "arithmetic": arithmetic, "cores": cores, "ghz": mhz / 1000, "clock_source": clock_source,
            "isa": isa, "vector_bits": bits, "lanes": lanes, "fma_units": FMA_UNITS, "derived_flops": derived,
            "lower_bound": lower_bound, "reached": reached}


# The clock, measured: WbCoreClockHz (native/wb_kernels.cc) times a chain of dependent integer adds, one a cycle on
# every x86-64 and AArch64 core, in CLOCK_LOOPS loops of CLOCK_ADDS adds (about 65 µs each at 4 GHz) and keeps the
# fastest: a loop that other processes or the hypervisor interrupt reads slow, and a short loop is seldom interrupted
# (under a load average of 7.7 on 2 cores the fastest of 500 read 4.091 GHz every time; the fastest of five 12-ms
# loops read 1.9-2.4). About 0.1 s quiet, 0.2-0.3 s under load; cached a day in core_clock.json beside the peaks.
CLOCK_ADDS, CLOCK_LOOPS = 1 << 18, 400
CLOCK_METHOD = 1  # cached clocks measured by an earlier method are measured again
CLOCK_HOW = "a dependent-add loop's cycles a second"


def measure_clock_hz() -> float | None:
    """The clock one core runs at now (Hz; turbo included) by the native library's WbCoreClockHz; None where the
    library is missing or stale (`kernels.library_problem`: no compiler, say) or its target has no such loop."""
    from helpers.run.kernels import LIBRARY, library_problem
    if library_problem():
        return None
    try:
        fn = ctypes.CDLL(str(LIBRARY)).WbCoreClockHz
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_int64, ctypes.c_int]
    hz = fn(CLOCK_ADDS, CLOCK_LOOPS)
    return hz if hz > 0 else None


def _machine_prefix() -> list[str]:
    """The fields that name this machine in a cache key (host, CPU model, logical CPUs)."""
    return [socket.gethostname(), cpu_model(), str(os.cpu_count())]


def _read_cache(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def measured_clock(refresh: bool = False) -> dict | None:
    """{hz, measured_at, method} of this machine's cores (`measure_clock_hz`), cached for PEAK_STALE_S in
    core_clock.json beside the peaks' cache and measured under the peaks' lock; None where it cannot be measured and
    none is cached."""
    path, key = _clock_cache_file(), "|".join(_machine_prefix())
    old = _read_cache(path).get(key)
    if not refresh and isinstance(old, dict) and old.get("method") == CLOCK_METHOD and old.get("hz") \
            and _age_s(old.get("measured_at")) <= PEAK_STALE_S:
        return old
    with _one_measurement_at_a_time(_cache_file()):  # not while another process times its matmuls
        hz = measure_clock_hz()
        if hz is None:
            return None
        cache = _read_cache(path)
        cache[key] = entry = {"hz": hz, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "method": CLOCK_METHOD}
        from helpers.record import atomic_write_json
        atomic_write_json(path, cache)
    return entry


def reached_rate(dtype: str = "fp32", device_target: str = "CPU") -> dict | None:
    """The fastest MatMul rate this machine's cache holds for `device_target` in `dtype` or fp32 (a narrower dtype's
    peak is never below fp32's): {flops, dtype, measured_at}; None if none. Any threads, MindSpore version, shapes
    or age: each is a rate these cores reached."""
    prefix, best = [*_machine_prefix(), device_target], None
    for key, entry in _read_cache(_cache_file()).items():
        parts = key.split("|")
        if parts[:4] != prefix or len(parts) < 5 or parts[4] not in {dtype, "fp32"} or not isinstance(entry, dict):
            continue
        flops = entry.get("flops")
        if isinstance(flops, (int, float)) and (best is None or flops > best["flops"]):
            best = {"flops": float(flops), "dtype": parts[4], "measured_at": entry.get("measured_at")}
    return best


# ---------------------------------------------------------------------------------------- achievable peak

def matmul_shapes(cfg: Config, vocab: int | None = None) -> list[tuple[int, int, int]]:
    """The model's own matmul shapes (M, K, N) for one micro-batch: q/k/v projection (k and v n_kv_head heads wide),
    attention output, MLP up and down, and the output head when `vocab` is known; M = micro-batch × context tokens."""
    m, d = cfg.tokens_per_micro_batch, cfg.model.d_model
    hidden, kv = cfg.model.ffn_hidden, cfg.model.kv_heads * (d // cfg.model.n_head)
    qkv = [(m, d, d), (m, d, kv)] if cfg.model.qkv == "separate" else [(m, d, d + 2 * kv)]
    shapes = [*qkv, (m, d, d), (m, d, hidden), (m, hidden, d)] + ([(m, d, vocab)] if vocab else [])
    return list(dict.fromkeys(shapes))


def default_shapes() -> list[tuple[int, int, int]]:
    """The shapes of the default config's model (nanoGPT's CPU config), for a peak asked for without a model."""
    from helpers.config import from_dict
    return matmul_shapes(from_dict({}))


PEAK_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # config name → MindSpore dtype name
# Each timed loop lasts at least about this long, so the host's per-call dispatch and the final sync are spread over
# its calls. A loop sized to 10 ms by a call count taken from the warm-up call (kernel selection included) ran one
# to six calls, and read 68-83 GFLOP/s where 145-152 is right at 768×128×512.
LOOP_S = 0.05
PEAK_METHOD = 2  # cached peaks timed by an earlier method are measured again


def peak_dtype(dtype: str):
    """The MindSpore dtype a peak for `dtype` (fp32 or any amp_dtype: fp16, bf16) is measured in."""
    import mindspore as ms
    if dtype not in PEAK_DTYPES:
        raise ValueError(f"no matmul peak for dtype {dtype!r}; choose one of {', '.join(PEAK_DTYPES)}")
    return getattr(ms, PEAK_DTYPES[dtype])


def measure_peak_flops(dtype: str = "fp32", shapes=None, repeats: int = 5) -> dict:
    """MatMul FLOP/s on the current MindSpore device for each (M, K, N) in `shapes`: the best of `repeats` loops of
    back-to-back calls (each loop ≥ LOOP_S, synchronised at its end; other load can only slow a loop, so the best is
    nearest the peak). Returns {flops: the fastest shape's, shapes: [{shape, flops}]}."""
    import numpy as np
    from mindspore import Tensor, ops

    ms_dtype, matmul, rates = peak_dtype(dtype), ops.MatMul(), []
    shapes = shapes or default_shapes()
    rng = np.random.default_rng(0)
    for m, k, n in shapes:
        a = Tensor(rng.standard_normal((m, k)).astype(np.float32)).astype(ms_dtype)
        b = Tensor(rng.standard_normal((k, n)).astype(np.float32)).astype(ms_dtype)
        try:
            matmul(a, b).asnumpy()  # warm-up: kernel selection and allocation, not a call's time
        except TypeError as exc:  # the device has no MatMul kernel for this dtype (bf16 on CPU)
            raise RuntimeError(f"no {dtype} matmul on this device, so no {dtype} peak to measure "
                               f"({str(exc).splitlines()[0]}); measure it on a device that runs {dtype}") from None
        # the call count from the fastest of three synchronised calls: one slow call made loops too short to time,
        # and a loop that only checks the clock can queue far more calls than LOOP_S runs (dispatch is asynchronous)
        calls = max(1, math.ceil(LOOP_S / min(_timed_call(matmul, a, b) for _ in range(3))))
        best = 0.0
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                out = matmul(a, b)
            out.asnumpy()
            best = max(best, 2.0 * m * k * n * calls / (time.perf_counter() - t0))
        rates.append({"shape": [m, k, n], "flops": best})
    return {"flops": max(r["flops"] for r in rates), "shapes": rates}


def _timed_call(matmul, a, b) -> float:
    """Seconds one matmul call takes, synchronised (at least 1 µs)."""
    t0 = time.perf_counter()
    matmul(a, b).asnumpy()
    return max(time.perf_counter() - t0, 1e-6)


def _cache_file() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "mindspore-workbook" / "peak_flops.json"


def _clock_cache_file() -> Path:
    """The measured clocks, beside the matmul peaks (a file of their own: the peaks' entries all have `flops`)."""
    return _cache_file().with_name("core_clock.json")


def _machine_key(device_target: str, dtype: str, threads: int, shapes) -> str:
    try:
        ms_version = metadata.version("mindspore")
    except metadata.PackageNotFoundError:
        ms_version = "?"
    return "|".join([*_machine_prefix(), device_target, dtype, str(threads or "default"), ms_version,
                     ",".join("x".join(map(str, s)) for s in shapes)])


# When a cached peak is measured again (the peak is what every MFU is divided by, so a low one inflates MFU):
PEAK_STALE_S = 24 * 3600.0  # older than a day: co-tenants, governor and background load change over hours
# Under load: other processes took more than this many cores of CPU while the matmuls ran (from /proc/stat). The
# 1-min load average lags: it reads 1.0-1.8 on 2 cores right after a training run with nothing else running, and it
# passed (1.03) a peak that read half of one measured two seconds later; a process spinning beside the measurement
# takes 0.98 cores by /proc/stat, none 0.02.
OTHERS_LIMIT_CORES = 0.25
# A peak measured under load is tried again at most this often until one try runs quiet: under steady load (a
# round's two arms, a test suite) every run had measured it again, 2-10 s each (388 s of a 918-s suite's runs,
# docs/data/2026-12-03-peak-remeasures.json), and time-to-target arms paid it inside their wall seconds.
PEAK_RETRY_S = 600.0
PEAK_LOADED_PER_CORE = 0.75  # where /proc/stat cannot be read: 1-min load average per core above which it counts


def load_average() -> float:
    """The 1-minute load average (runnable processes, averaged; compare with os.cpu_count())."""
    return os.getloadavg()[0]


def host_busy_s() -> float | None:
    """CPU seconds every process on this host has used since boot (all but idle and I/O wait, steal included: a
    co-tenant VM's time is time this host's processes did not get), from /proc/stat; None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def others_cores(call: Callable[[], T]) -> tuple[T, float | None]:
    """(call(), cores of CPU that other processes used while it ran: the host's busy CPU seconds minus this
    process's, ÷ wall seconds; None where /proc/stat cannot be read)."""
    busy, own, t0 = host_busy_s(), time.process_time(), time.perf_counter()
    out = call()
    after, own, wall = host_busy_s(), time.process_time() - own, time.perf_counter() - t0
    if busy is None or after is None or wall <= 0:
        return out, None
    return out, round(max(0.0, (after - busy - own) / wall), 3)


def _loaded(entry: dict, cores: int) -> bool:
    """Whether a measurement ran under load: other processes' cores, else the 1-min load average."""
    if entry.get("others_cores") is not None:
        return entry["others_cores"] > OTHERS_LIMIT_CORES
    return entry["load_avg_1m"] > PEAK_LOADED_PER_CORE * cores


def _awaiting_quiet(entry: dict, cores: int) -> bool:
    """Whether a cached peak was measured under load and no try since has run quiet (it is tried again)."""
    return _loaded(entry, cores) and not entry.get("quiet_at")


def _load_words(entry: dict) -> str:
    others = entry.get("others_cores")
    return f"load {entry['load_avg_1m']:.2f}" + ("" if others is None else f", other processes {others:.2f} cores")


def _age_s(measured_at: str) -> float:
    try:
        return time.time() - time.mktime(time.strptime(measured_at, "%Y-%m-%dT%H:%M:%S"))
    except (TypeError, ValueError):
        return float("inf")  # unreadable: as good as stale


def _why_remeasure(entry: dict | None, cores: int) -> str:
    """Why a cached peak cannot be used ("" when it can)."""
    if entry is None:
        return "no peak cached for this machine, device, dtype, threads and shapes"
    if "load_avg_1m" not in entry or "others_cores" not in entry:
        return f"the cached peak of {entry.get('measured_at')} has no record of the CPU other processes used"
    if _age_s(entry.get("measured_at")) > PEAK_STALE_S:
        return f"the cached peak of {entry.get('measured_at')} is older than {PEAK_STALE_S / 3600:.0f} h"
    if entry.get("method") != PEAK_METHOD:
        return f"the cached peak of {entry.get('measured_at')} was timed by an earlier method (loops under 50 ms)"
    if _awaiting_quiet(entry, cores) and _age_s(entry.get("tried_at", entry["measured_at"])) > PEAK_RETRY_S:
        return (f"the cached peak of {entry['measured_at']} was measured under load ({_load_words(entry)}), and no "
                f"try in the last {PEAK_RETRY_S / 60:.0f} min ran quiet")
    return ""


def peak_flops_info(device_target: str = "CPU", dtype: str = "fp32", threads: int = 0, shapes=None,
                    refresh: bool = False) -> dict:
    """The achievable matmul peak behind MFU and where it came from, cached in ~/.cache per machine, device, dtype,
    op threads and shapes ((M, K, N) triples; None: the default config's model, `default_shapes`).

    Returns {flops (FLOP/s), shapes ([{shape: [M, K, N], flops}]), name (one line: what the peak is), measured_at
    (local time, ISO), load_avg_1m (the higher 1-minute load average of before and after the measurement),
    others_cores (cores of CPU other processes used during it, `others_cores`), cores, loaded (others_cores >
    OTHERS_LIMIT_CORES), quiet_at (when a measurement last ran quiet, None if none has since the peak was
    measured), source (one line: cached, or measured now and why)}.
    A cached peak is measured again when it is stale (older than PEAK_STALE_S), timed another way (PEAK_METHOD),
    measured under load with no quiet measurement since (quiet_at) and last tried over PEAK_RETRY_S ago (tried_at,
    local time, ISO), or `refresh`. A new measurement lower than a fresh cached one leaves the cached one: load, and
    a process that happened to time its matmuls slowly (a quiet one here read 82.9 GFLOP/s where the one before it
    read 157.8), can only slow a matmul down, so the higher is nearer the peak.
    """
    shapes = [tuple(s) for s in (shapes or default_shapes())]
    path, key = _cache_file(), _machine_key(device_target, dtype, threads, shapes)
    with _one_measurement_at_a_time(path):
        return _peak_flops_info(path, key, device_target, dtype, shapes, refresh)


@contextmanager
def _one_measurement_at_a_time(cache: Path) -> Iterator[None]:
    """Hold a lock beside the cache: processes that measure together (the ranks of a data-parallel run, starting at
    once) would each time a share of the cores; the second finds the first's peak cached instead."""
    import fcntl
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _peak_flops_info(path: Path, key: str, device_target: str, dtype: str, shapes: list, refresh: bool) -> dict:
    cores = os.cpu_count() or 1
    cache = _read_cache(path)
    old = cache.get(key)
    why = "refresh requested" if refresh else _why_remeasure(old, cores)
    name = (f"achievable: MindSpore's {dtype} MatMul on {device_target}, the fastest of the model's shapes "
            f"{', '.join('×'.join(map(str, s)) for s in shapes)} (M×K×N)")
    if not why:
        retry = f" (under load; tried again at most every {PEAK_RETRY_S / 60:.0f} min until a try runs quiet)" \
            if _awaiting_quiet(old, cores) else ""
        return {**old, "name": name, "cores": old.get("cores", cores), "loaded": _loaded(old, cores),
                "source": f"cached: measured {old['measured_at']} at {_load_words(old)} on {cores} cores{retry}"}
    before = load_average()
    measured, others = others_cores(lambda: measure_peak_flops(dtype, shapes))
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    new = {**measured, "measured_at": now, "load_avg_1m": round(max(before, load_average()), 2),
           "others_cores": others, "cores": cores, "method": PEAK_METHOD}
    fresh = bool(old) and old.get("method") == PEAK_METHOD and "others_cores" in old \
        and _age_s(old["measured_at"]) <= PEAK_STALE_S
    quiet_at = None if _loaded(new, cores) else now
    if fresh and old["flops"] > new["flops"]:
        note = (f"cached: measured {old['measured_at']} at {_load_words(old)} on {cores} cores; measured again now "
                f"at {_load_words(new)}, it read lower ({new['flops'] / 1e9:.1f} GFLOP/s), so the higher one stays")
        entry = {**old, "cores": cores, "quiet_at": quiet_at or old.get("quiet_at"), "tried_at": now}
    else:
        note = f"measured now at {_load_words(new)} on {cores} cores ({why})"
        entry = {**new, "quiet_at": quiet_at or (old.get("quiet_at") if fresh else None)}
    cache[key] = entry
    from helpers.record import atomic_write_json
    atomic_write_json(path, cache)
    return {**entry, "loaded": _loaded(entry, cores), "name": name, "source": note}


def peak_flops(device_target: str = "CPU", dtype: str = "fp32", threads: int = 0, shapes=None,
               refresh: bool = False) -> float:
    """The achievable matmul peak (FLOP/s) for this machine/device/dtype/threads/shapes (see `peak_flops_info`)."""
    return float(peak_flops_info(device_target, dtype, threads, shapes, refresh)["flops"])


def peak_summary(info: dict, hardware: dict | None) -> dict:
    """The summary.json keys naming both peaks a run's MFU was divided by (the FLOP/s themselves are `peak_flops`
    and `peak_flops_hardware`, written by metrics.summarize)."""
    return {"peak_flops_name": info.get("name"), "peak_flops_shapes": info.get("shapes"),
            "peak_flops_measured_at": info.get("measured_at"), "peak_flops_load_avg": info.get("load_avg_1m"),
            "peak_flops_others_cores": info.get("others_cores"),
            "peak_flops_loaded": info.get("loaded"), "peak_flops_source": info.get("source"),
            "peak_flops_hardware_arithmetic": (hardware or {}).get("arithmetic"),
            "peak_flops_hardware_lower_bound": (hardware or {}).get("lower_bound")}
