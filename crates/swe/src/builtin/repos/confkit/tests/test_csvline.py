import unittest

from confkit.csvline import split_line


class TestSplitLine(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(split_line("a,b,c"), ["a", "b", "c"])

    def test_quoted_delimiter(self):
        self.assertEqual(split_line('x,"y,z",w'), ["x", "y,z", "w"])

    def test_escaped_quote(self):
        self.assertEqual(split_line('"say ""hi""",2'), ['say "hi"', "2"])

    def test_trailing_empty_field(self):
        self.assertEqual(split_line("a,b,"), ["a", "b", ""])

    def test_empty_line_is_one_empty_field(self):
        self.assertEqual(split_line(""), [""])

    def test_other_delimiter(self):
        self.assertEqual(split_line("1;2;3", delimiter=";"), ["1", "2", "3"])

    def test_unterminated_quote(self):
        with self.assertRaises(ValueError):
            split_line('"open,field')


if __name__ == "__main__":
    unittest.main()
