"""Small string helpers."""

from .core import camel_to_snake, is_palindrome, slugify, truncate, wrap

__all__ = ["camel_to_snake", "is_palindrome", "slugify", "truncate", "wrap"]
