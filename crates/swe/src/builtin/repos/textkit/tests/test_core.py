import unittest

from textkit.core import camel_to_snake, is_palindrome, slugify, truncate, wrap


class TestSlugify(unittest.TestCase):
    def test_basic(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_punctuation_collapses(self):
        self.assertEqual(slugify("  Rust -- and  Python!  "), "rust-and-python")

    def test_digits_are_kept(self):
        self.assertEqual(slugify("Release 2 of 10"), "release-2-of-10")

    def test_custom_separator(self):
        self.assertEqual(slugify("a b c", sep="_"), "a_b_c")


class TestTruncate(unittest.TestCase):
    def test_short_text_unchanged(self):
        self.assertEqual(truncate("abc", 10), "abc")

    def test_long_text_cut(self):
        self.assertEqual(truncate("hello world", 8), "hello...")

    def test_exact_width_unchanged(self):
        self.assertEqual(truncate("hello", 5), "hello")

    def test_width_smaller_than_ellipsis(self):
        with self.assertRaises(ValueError):
            truncate("hello", 2)

    def test_custom_ellipsis(self):
        self.assertEqual(truncate("abcdefgh", 5, ellipsis="~"), "abcd~")


class TestWrap(unittest.TestCase):
    def test_wraps_long_text(self):
        self.assertEqual(wrap("one two three four", 9), ["one two", "three", "four"])

    def test_exact_fit_stays_on_one_line(self):
        self.assertEqual(wrap("aaa bbb", 7), ["aaa bbb"])

    def test_long_word_gets_own_line(self):
        self.assertEqual(wrap("a verylongword b", 4), ["a", "verylongword", "b"])

    def test_empty(self):
        self.assertEqual(wrap("   ", 5), [])


class TestCamelToSnake(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(camel_to_snake("CamelCase"), "camel_case")

    def test_lower_start(self):
        self.assertEqual(camel_to_snake("parseHttp"), "parse_http")

    def test_acronym(self):
        self.assertEqual(camel_to_snake("HTTPServer"), "http_server")

    def test_already_snake(self):
        self.assertEqual(camel_to_snake("already_snake"), "already_snake")


class TestPalindrome(unittest.TestCase):
    def test_simple(self):
        self.assertTrue(is_palindrome("level"))

    def test_mixed_case(self):
        self.assertTrue(is_palindrome("Racecar"))

    def test_sentence(self):
        self.assertTrue(is_palindrome("A man, a plan, a canal: Panama"))

    def test_not_palindrome(self):
        self.assertFalse(is_palindrome("python"))


if __name__ == "__main__":
    unittest.main()
