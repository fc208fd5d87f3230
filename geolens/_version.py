"""The version of geolens, written here only: ``geolens.__version__``, the package metadata (read
from this file by ``pyproject.toml``) and the manifests of model caches and run folders."""

__version__ = "0.2.0"
