"""Command line: `python -m helpers train|resume|show ...`."""
import os
import sys

from helpers.cli import main  # absolute: the compile cache parses this file's imports

code = main()
if not isinstance(code, int):
    raise SystemExit(code)  # what a command returned that is not an exit status keeps SystemExit's meaning
# Every record, checkpoint and progress line is written (atomically, fsynced) by now. The interpreter's teardown
# after MindSpore took ~0.7 s per process here (measured on a paired round's child), paid by every run a round or
# notebook starts, so the child leaves at once.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
