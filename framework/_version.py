"""The version of framework: one place, read by the package and the command line."""

__version__ = "0.1.0"
