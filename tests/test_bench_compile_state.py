"""The bench's own speed comparisons (validity's truths and cross-checks, power's ballast calibration) train each arm
as a round's arms are trained: graph compiled in its own process (`config.speed_measured`). With the compile cache
on, one arm loaded its graph and stepped faster than the other that compiled it, so a truth measured something the
rounds it judges do not."""
from __future__ import annotations

import sys

import pytest

from helpers.config import from_dict
from tests.conftest import REPO


class Launched(Exception):
    """Raised by the stand-in launchers once they have seen the configs they were given."""


@pytest.fixture()
def bench_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import power_item
    import validity_item
    yield validity_item, power_item
    for name in ("power_item", "validity_item"):
        sys.modules.pop(name, None)


def _stand_in(seen: list):
    def launch(*args, **kwargs):
        seen.extend(a for a in args if hasattr(a, "compile_cache"))
        raise Launched
    return launch


def test_truths_cross_checks_and_calibration_compile_each_arm(bench_modules, monkeypatch, tmp_path):
    validity_item, power_item = bench_modules
    cfg = from_dict({"model": {"preset": "tiny"}, "steps": 12})
    assert cfg.compile_cache  # the default: the rule has something to turn off
    cand = from_dict({"model": {"preset": "tiny", "ballast": 64}, "steps": 12})
    for module, call in ((validity_item, lambda: validity_item._interleaved(cfg, cand, tmp_path / "t", 16)),
                         (validity_item, lambda: validity_item._standalone(cfg, cand, tmp_path / "s", 2, 16)),
                         (power_item, lambda: power_item.calibrate(cfg))):
        seen: list = []
        for name in ("launch_stepped", "launch_or_reuse"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, _stand_in(seen))
        with pytest.raises(Launched):
            call()
        assert seen and all(c.compile_cache is False for c in seen), [c.compile_cache for c in seen]
