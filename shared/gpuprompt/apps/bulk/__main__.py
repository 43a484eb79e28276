"""``python -m gpuprompt.apps.bulk INPUT --into DIR``: the same as ``gpuprompt index-bulk``."""

import sys

from gpuprompt.apps.bulk._cli import main

sys.exit(main())
