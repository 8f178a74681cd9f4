"""The ampcert version, in a module of its own so that any layer can name it
without importing the package's public face (``ampcert/__init__.py``)."""

__version__ = "0.1.0"
