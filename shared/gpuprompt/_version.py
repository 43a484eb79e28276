"""The one version source of gpuprompt (read by the build, re-exported by the package face)."""

__version__ = "0.1.0"
