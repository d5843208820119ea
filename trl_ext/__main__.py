"""``python -m trl_ext``: the ``trl-ext`` command."""

import sys

from trl_ext.commands.cli import main

sys.exit(main())
