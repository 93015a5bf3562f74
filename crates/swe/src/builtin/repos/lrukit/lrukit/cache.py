"""A least-recently-used cache on top of OrderedDict."""

import functools
from collections import OrderedDict


class LRUCache:
    """Keeps at most `capacity` entries, evicting the least recently used one."""

    def __init__(self, capacity=128):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._data = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key, default=None):
        """The value for `key` (marking it as recently used), or `default`."""
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]
        self.misses += 1
        return default

    def put(self, key, value):
        """Store `value` under `key` as the most recently used entry."""
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def peek(self, key, default=None):
        """The value for `key` without changing its recency or the statistics."""
        return self._data.get(key, default)

    def keys(self):
        """Keys from least to most recently used."""
        return list(self._data)

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return key in self._data


def memoize(capacity=128):
    """Cache a function's results by its positional and keyword arguments."""

    def decorate(func):
        cache = LRUCache(capacity)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            key = (args, tuple(sorted(kwargs.items())))
            missing = object()
            value = cache.get(key, missing)
            if value is missing:
                value = func(*args, **kwargs)
                cache.put(key, value)
            return value

        wrapper.cache = cache
        return wrapper

    return decorate
