"""Whether the device a config names is on this machine, told from the machine alone (device files, a vendor tool on
PATH, a toolkit's environment) without importing MindSpore: a config for a device that is not here is refused in
one line before msrun or MindSpore start, instead of MindSpore's own error seconds later.

Any one sign counts as the device being here, so a machine that has it is never refused; a machine with a sign
but no usable device still meets MindSpore's error."""
from __future__ import annotations

import glob
import os
import shutil
from dataclasses import dataclass

from helpers.config import Config, ConfigError


@dataclass(frozen=True)
class Signs:
    """What shows a device is present: device files (glob patterns), tools on PATH, environment variables set."""
    name: str  # how the message names the device
    files: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    env: tuple[str, ...] = ()

    def seen(self) -> bool:
        """Whether any sign is on this machine."""
        return (any(glob.glob(p) for p in self.files) or any(shutil.which(t) for t in self.tools)
                or any(os.environ.get(v) for v in self.env))

    def looked_for(self) -> str:
        """The signs, as the message lists them: 'no /dev/davinci*, no npu-smi on PATH, no ASCEND_HOME_PATH'."""
        return ", ".join([*(f"no {p.replace('[0-9]', '')}" for p in self.files),
                          *(f"no {t} on PATH" for t in self.tools), *(f"no {v}" for v in self.env)])


# Ascend: the NPU device files (/dev/davinci0, …), the driver's npu-smi, the CANN toolkit's set_env.sh variable.
# GPU: the NVIDIA driver's device files (/dev/nvidia0, …) and its nvidia-smi. CPU is always here.
SIGNS: dict[str, Signs] = {
    "Ascend": Signs("Ascend device", files=("/dev/davinci[0-9]*",), tools=("npu-smi",), env=("ASCEND_HOME_PATH",)),
    "GPU": Signs("NVIDIA GPU", files=("/dev/nvidia[0-9]*",), tools=("nvidia-smi",)),
}


def absent(target: str) -> str:
    """'' when `target`'s device is here (CPU always is); else what was looked for and not found."""
    signs = SIGNS.get(target)
    return "" if signs is None or signs.seen() else signs.looked_for()


def check_device(cfg: Config) -> None:
    """Refuse (ConfigError, one line that names the fix) a config whose device_target is not on this machine."""
    missing = absent(cfg.device_target)
    if missing:
        raise ConfigError(f"device_target={cfg.device_target}: no {SIGNS[cfg.device_target].name} here ({missing}); "
                          f"set device_target=CPU, or import the recipe with --target cpu")
