"""Command line: `python -m helpers train|resume|show ...`."""
from .cli import main

raise SystemExit(main())
