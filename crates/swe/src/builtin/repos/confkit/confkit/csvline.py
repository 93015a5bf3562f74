"""Split one CSV line into fields (RFC 4180 quoting, no embedded newlines)."""


def split_line(line, delimiter=","):
    fields = []
    field = []
    in_quotes = False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_quotes:
            if ch == '"':
                if i + 1 < len(line) and line[i + 1] == '"':
                    field.append('"')
                    i += 1
                else:
                    in_quotes = False
            else:
                field.append(ch)
        elif ch == '"':
            in_quotes = True
        elif ch == delimiter:
            fields.append("".join(field))
            field = []
        else:
            field.append(ch)
        i += 1
    if in_quotes:
        raise ValueError("unterminated quoted field")
    fields.append("".join(field))
    return fields
