"""``python -m inq.cli``: the ``inq`` command without its console script."""

import sys

from inq.cli import main

sys.exit(main())
