"""Read INI text into nested dictionaries.

Sections are `[name]` lines; entries are `key = value` lines; lines starting with `#` or `;`
are comments. Keys are case-insensitive (stored in lower case); values keep their case.
Entries before the first section belong to the section named "".
"""


class ParseError(ValueError):
    """A line that is neither a section, an entry nor a comment."""

    def __init__(self, line_no, message):
        super().__init__("line %d: %s" % (line_no, message))
        self.line_no = line_no


def parse(text):
    data = {}
    section = ""
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError(line_no, "unclosed section header")
            section = line[1:-1].strip()
            data.setdefault(section, {})
            continue
        if "=" not in line:
            raise ParseError(line_no, "expected `key = value`")
        key, value = line.split("=", 1)
        data.setdefault(section, {})[key.strip().lower()] = value.strip()
    return data


_TRUE = ("1", "yes", "true", "on")
_FALSE = ("0", "no", "false", "off")


def get_bool(data, section, key, default=False):
    """The entry as a boolean; `default` when it is missing."""
    value = data.get(section, {}).get(key.lower())
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("not a boolean: %r" % value)


def get_int(data, section, key, default=None):
    """The entry as an integer; `default` when it is missing."""
    value = data.get(section, {}).get(key.lower())
    if value is None:
        return default
    return int(value)
