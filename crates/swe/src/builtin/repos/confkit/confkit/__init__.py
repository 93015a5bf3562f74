"""A tiny INI reader and a CSV line splitter."""

from .csvline import split_line
from .ini import ParseError, get_bool, get_int, parse

__all__ = ["ParseError", "get_bool", "get_int", "parse", "split_line"]
