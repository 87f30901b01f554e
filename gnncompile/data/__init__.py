"""Mini-batch loading for training over many graphs: :class:`PooledLoader`."""
from .loader import PooledLoader

__all__ = ["PooledLoader"]
