"""The one error type of Hugging Face weights in and out of the workbook (its own module: the file reader, the
config.json table and the layouts all raise it)."""
from __future__ import annotations

from helpers.config import ConfigError


class WeightsError(ConfigError):
    """Weights that cannot go into the model as configured; the message is one line naming what and the fix."""
