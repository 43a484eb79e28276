"""``python -m gpuprompt.bulk INPUT --into DIR``: the same as ``gpuprompt index-bulk``."""

import sys

from gpuprompt.bulk._cli import main

sys.exit(main())
