"""A config whose device_target is not on this machine is refused in one line, before msrun or MindSpore start
(`run/devices.py`, through `preflight`); a machine that shows the device (its device files, its tool on PATH, the
toolkit's environment) is not refused."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest
import yaml

from helpers.config import ConfigError, from_dict
from helpers.run import devices
from helpers.run.devices import Signs, absent, check_device
from tests.conftest import REPO

NO_ASCEND = ("device_target=Ascend: no Ascend device here (no /dev/davinci*, no npu-smi on PATH, no ASCEND_HOME_PATH); "
             "set device_target=CPU, or import the recipe with --target cpu")


@pytest.fixture
def bare(monkeypatch, tmp_path):
    """A machine with no device sign: signs looked for under tmp_path, an empty PATH, no toolkit variable."""
    monkeypatch.setitem(devices.SIGNS, "GPU", Signs("NVIDIA GPU", files=(str(tmp_path / "nvidia[0-9]*"),),
                                                    tools=("nvidia-smi",)))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    (tmp_path / "bin").mkdir()
    return tmp_path


def test_cpu_is_always_here_and_a_device_without_signs_is_refused_naming_the_fix(bare):
    check_device(from_dict({}))
    with pytest.raises(ConfigError) as err:
        check_device(from_dict({}, {"device_target": "GPU"}))
    assert str(err.value) == (f"device_target=GPU: no NVIDIA GPU here (no {bare}/nvidia*, no nvidia-smi on PATH); set "
                              f"device_target=CPU, or import the recipe with --target cpu")


@pytest.mark.parametrize("sign", ["device file", "tool", "toolkit variable"])
def test_any_one_sign_of_the_device_lets_the_config_through(bare, monkeypatch, sign):
    ascend = Signs("Ascend device", files=(str(bare / "davinci[0-9]*"),), tools=("npu-smi",), env=("ASCEND_HOME_PATH",))
    monkeypatch.setitem(devices.SIGNS, "Ascend", ascend)
    assert absent("Ascend")
    if sign == "device file":
        (bare / "davinci0").touch()
    elif sign == "tool":
        tool = bare / "bin" / "npu-smi"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    else:
        monkeypatch.setenv("ASCEND_HOME_PATH", "/usr/local/Ascend/ascend-toolkit/latest")
    assert absent("Ascend") == ""
    check_device(from_dict({}, {"device_target": "Ascend"}))


@pytest.mark.skipif(not absent("Ascend"), reason="this machine has an Ascend device: an Ascend config trains here")
@pytest.mark.parametrize("command, data_parallel", [("train", 1), ("train", 2), ("profile", 1)])
def test_an_ascend_run_is_refused_before_mindspore_or_msrun_start(tmp_path, command, data_parallel):
    """The refusal comes from the CLI's preflight: MindSpore is never imported (-X importtime lists every module the
    process imported), no run folder is made, and it takes a fraction of the ~9 s MindSpore took to refuse it."""
    config = tmp_path / "ascend.yaml"
    config.write_text(yaml.safe_dump({"device_target": "Ascend", "batch_size": 8,
                                      "parallel": {"data_parallel": data_parallel}}))
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONPROFILEIMPORTTIME="1")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "helpers", command, "--config", str(config), "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    took = time.monotonic() - start
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    said = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and said == [f"error: {NO_ASCEND}"], proc.stderr[-2000:]
    assert imported and not [m for m in imported if m.split(".")[0] == "mindspore"]
    assert not out.exists() and took < 5.0, took
