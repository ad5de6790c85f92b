"""The package's version (``gazeguard.__version__``), here so that any layer can name it without
importing the package's top level, which names the upper layers' public API."""

__version__ = "0.1.0"
