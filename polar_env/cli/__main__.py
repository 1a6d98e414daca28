"""``python -m polar_env.cli``: the ``polar`` command."""

import sys

from polar_env.cli import main

sys.exit(main())
