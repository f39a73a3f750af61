"""The one place the version lives (read by hatchling, the user-agent, ``__version__``)."""

__version__ = "0.2.0"
