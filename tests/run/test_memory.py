"""The memory source of a run: process RSS on CPU, MindSpore's device allocator on GPU/Ascend."""
from __future__ import annotations

import pytest

from helpers.record import DEVICE, RSS, MetricColumns, memory_label
from helpers.run.memory import DeviceMemory, default_memory_limit, device_total_bytes
from helpers.run.metrics import peak_rss_bytes, summarize
from tests.conftest import mindspore_on_cpu


def _rows(device_bytes):
    return MetricColumns.of_rows([{"step": i + 1, "step_time_ms": 10.0, "data_wait_ms": 0.1, "tokens": 64,
                                   "loss": 3.0, "device_memory_bytes": b} for i, b in enumerate(device_bytes)])


def test_device_reader_runs_mindspores_api_on_cpu_and_reads_its_documented_zeros():
    import mindspore as ms
    import numpy as np
    mindspore_on_cpu()
    reader = DeviceMemory("CPU")
    x = ms.Tensor(np.ones((256, 256), np.float32))
    (x @ x).asnumpy()
    # ms.runtime.max_memory_allocated is documented to return 0 on CPU: the reader gets MindSpore's own value
    assert reader.step_peak() == ms.runtime.max_memory_allocated() == 0 and reader.peak == 0
    stats = reader.stats()
    assert {"device_total_reserved_memory_bytes", "device_max_allocated_memory_bytes"} <= set(stats)
    assert all(v == 0 for k, v in stats.items() if k != "device_memory_total_bytes")
    assert stats["device_memory_total_bytes"] is None  # ms.hal.get_device_properties returns None on CPU


def test_device_total_needs_a_device():
    import mindspore as ms
    target = next((t for t in ("Ascend", "GPU") if ms.hal.is_available(t)), None)
    if target is None:
        pytest.skip("ms.hal.get_device_properties needs a GPU or Ascend device (it returns None on CPU)")
    total = device_total_bytes(target)
    assert total > 2**30 and default_memory_limit(target) == int(0.9 * total)


def test_summary_takes_the_peak_from_the_named_source():
    device = summarize(_rows([5 * 2**20, 9 * 2**20, 7 * 2**20]), 1, 1, 0.0, None, memory_source=DEVICE)
    assert device["memory_source"] == DEVICE and device["peak_memory_bytes"] == device["peak_device_memory_bytes"]
    assert device["peak_device_memory_bytes"] == 9 * 2**20 and device["peak_rss_bytes"] > 0
    cpu = summarize(_rows([None, None]), 1, 1, 0.0, None)
    assert cpu["memory_source"] == RSS and cpu["peak_device_memory_bytes"] is None
    assert cpu["peak_rss_bytes"] <= cpu["peak_memory_bytes"] <= peak_rss_bytes()


def test_labels_say_which_memory_a_figure_is():
    assert memory_label({"memory_source": DEVICE}) == "peak device memory"
    assert memory_label({"memory_source": RSS}) == memory_label({}) == "peak RSS"  # older records: CPU runs
    assert default_memory_limit("CPU") > 0


def test_a_process_started_from_a_large_one_reports_its_own_peak():
    """ru_maxrss survives exec: a run launched by a 300 MB parent read 300 MB as its own peak."""
    import subprocess
    import sys

    import numpy as np
    ballast = np.ones(300 * 2 ** 20 // 8)  # touched: resident in this process
    assert peak_rss_bytes() >= ballast.nbytes
    child = subprocess.run([sys.executable, "-c", "from helpers.run.metrics import peak_rss_bytes; "
                            "print(peak_rss_bytes())"], capture_output=True, text=True, check=True)
    assert int(child.stdout) < ballast.nbytes / 2, "the child read its parent's peak"
