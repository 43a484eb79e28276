"""``python -m gpuprompt``: the ``gpuprompt`` command (:mod:`gpuprompt.apps.cli`)."""

from gpuprompt.apps.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
