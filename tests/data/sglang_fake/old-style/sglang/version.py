# ruff: noqa
__version__ = "0.4.6.post1"
