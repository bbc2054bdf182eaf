"""``python -m logstore``: the same as the ``logstore`` command."""

from logstore.cli import main

raise SystemExit(main())
