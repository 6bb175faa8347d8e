"""MindSpore LLM-training tuning workbook: config, data, model, train, metrics, record, runner.

Importing this package does not import MindSpore; training code does, in its own process.
"""
from .config import Config, ConfigError, load_config
from .record import RunRecord, load_run
from .runner import launch

__all__ = ["Config", "ConfigError", "RunRecord", "launch", "load_config", "load_run"]
