"""Dense matrices as lists of rows."""

from .matrix import Matrix, identity

__all__ = ["Matrix", "identity"]
