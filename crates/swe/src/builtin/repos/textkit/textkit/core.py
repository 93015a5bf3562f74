"""String helpers used across the project."""

import re


def slugify(text, sep="-"):
    """Lower-case `text` and join its runs of letters and digits with `sep`."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return sep.join(words)


def truncate(text, width, ellipsis="..."):
    """Cut `text` to at most `width` characters, ending with `ellipsis` when cut."""
    if width < len(ellipsis):
        raise ValueError("width is smaller than the ellipsis")
    if len(text) <= width:
        return text
    return text[: width - len(ellipsis)] + ellipsis


def wrap(text, width):
    """Greedy word wrap: lines of at most `width` characters (a longer word gets its own line)."""
    if width < 1:
        raise ValueError("width must be positive")
    lines = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def camel_to_snake(name):
    """Convert `CamelCase` (acronyms included, as in `HTTPServer`) to `snake_case`."""
    out = []
    for i, ch in enumerate(name):
        if ch.isupper():
            follows_lower = i > 0 and not name[i - 1].isupper()
            ends_acronym = (
                i > 0
                and name[i - 1].isupper()
                and i + 1 < len(name)
                and name[i + 1].islower()
            )
            if follows_lower or ends_acronym:
                out.append("_")
            out.append(ch.lower())
        else:
            out.append(ch)
    return "".join(out)


def is_palindrome(text):
    """Whether `text` reads the same backwards, ignoring case, spaces and punctuation."""
    cleaned = [c.lower() for c in text if c.isalnum()]
    return cleaned == cleaned[::-1]
