"""The package's version: recorded in export manifests and headers."""

__version__ = "0.1.0"
