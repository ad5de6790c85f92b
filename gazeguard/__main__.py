"""``python -m gazeguard`` is the same as the ``gazeguard`` command."""

from gazeguard.cli import main

raise SystemExit(main())
