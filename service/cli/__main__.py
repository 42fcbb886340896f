"""``python -m tiletune.service.cli``: the ``tiletune`` command."""

import sys

from tiletune.service.cli.main import main

sys.exit(main())
