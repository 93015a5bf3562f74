"""A least-recently-used cache and a memoising decorator."""

from .cache import LRUCache, memoize

__all__ = ["LRUCache", "memoize"]
