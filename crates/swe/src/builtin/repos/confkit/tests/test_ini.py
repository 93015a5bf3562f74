import unittest

from confkit.ini import ParseError, get_bool, get_int, parse

SAMPLE = """\
# global settings
name = demo

[server]
Host = example.org
port = 8080
debug = yes

# client settings
[client]
retries = 3
url = https://example.org/?a=1&b=2
"""


class TestParse(unittest.TestCase):
    def test_sections_and_keys(self):
        data = parse(SAMPLE)
        self.assertEqual(data["server"]["port"], "8080")
        self.assertEqual(data[""]["name"], "demo")

    def test_keys_are_lower_case(self):
        self.assertEqual(parse(SAMPLE)["server"]["host"], "example.org")

    def test_value_with_equals_sign(self):
        self.assertEqual(parse(SAMPLE)["client"]["url"], "https://example.org/?a=1&b=2")

    def test_semicolon_comment(self):
        self.assertEqual(parse("; note\n[a]\nx = 1\n"), {"a": {"x": "1"}})

    def test_error_line_number(self):
        with self.assertRaises(ParseError) as caught:
            parse("[a]\nx = 1\nbroken line\n")
        self.assertEqual(caught.exception.line_no, 3)

    def test_unclosed_section(self):
        with self.assertRaises(ParseError):
            parse("[a\n")


class TestGetters(unittest.TestCase):
    def test_get_bool(self):
        self.assertTrue(get_bool(parse(SAMPLE), "server", "debug"))

    def test_get_bool_missing_uses_default(self):
        self.assertFalse(get_bool(parse(SAMPLE), "server", "verbose"))

    def test_get_bool_invalid(self):
        with self.assertRaises(ValueError):
            get_bool({"a": {"x": "maybe"}}, "a", "x")

    def test_get_int(self):
        self.assertEqual(get_int(parse(SAMPLE), "client", "retries"), 3)

    def test_get_int_key_case_insensitive(self):
        self.assertEqual(get_int(parse(SAMPLE), "client", "RETRIES"), 3)


if __name__ == "__main__":
    unittest.main()
