"""``python -m hwdash``."""

from hwdash.cli import main

raise SystemExit(main())
