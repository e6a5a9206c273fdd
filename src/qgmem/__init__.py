"""QGMem graph-token training."""
__version__ = "0.1.0"
