"""Command line: `python -m helpers train|resume|show ...`."""
from helpers.cli import main  # absolute: the compile cache parses this file's imports

raise SystemExit(main())
