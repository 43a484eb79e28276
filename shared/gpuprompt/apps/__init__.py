"""The applications on top of the core: the ``gpuprompt`` command (:mod:`.cli`), the demo, the
benchmarks (``gpuprompt bench``), bulk indexing (``gpuprompt index-bulk``) and the Ray Serve app.

Nothing in the core, the server or the adapters imports this package.
"""
