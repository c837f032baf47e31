"""``python -m examples.katta_like ...`` is the ``katta`` command (see :mod:`.ctl`)."""

import sys

from examples.katta_like.ctl import cli

sys.exit(cli())
