import unittest

from spans.interval import Interval, merge, total_length


class TestInterval(unittest.TestCase):
    def test_length(self):
        self.assertEqual(Interval(2, 7).length, 5)

    def test_rejects_reversed(self):
        with self.assertRaises(ValueError):
            Interval(3, 1)

    def test_contains_start(self):
        self.assertTrue(Interval(1, 4).contains(1))

    def test_contains_end_excluded(self):
        self.assertFalse(Interval(1, 4).contains(4))

    def test_overlaps(self):
        self.assertTrue(Interval(0, 5).overlaps(Interval(4, 9)))

    def test_touching_do_not_overlap(self):
        self.assertFalse(Interval(0, 5).overlaps(Interval(5, 9)))

    def test_intersection(self):
        self.assertEqual(Interval(0, 5).intersection(Interval(3, 9)), Interval(3, 5))

    def test_intersection_of_touching_is_none(self):
        self.assertIsNone(Interval(0, 5).intersection(Interval(5, 9)))


class TestMerge(unittest.TestCase):
    def test_merges_overlapping(self):
        self.assertEqual(
            merge([Interval(5, 8), Interval(1, 3), Interval(2, 4)]),
            [Interval(1, 4), Interval(5, 8)],
        )

    def test_merges_touching(self):
        self.assertEqual(merge([Interval(1, 3), Interval(3, 6)]), [Interval(1, 6)])

    def test_nested(self):
        self.assertEqual(merge([Interval(1, 10), Interval(2, 3)]), [Interval(1, 10)])

    def test_total_length(self):
        self.assertEqual(total_length([Interval(0, 2), Interval(1, 4), Interval(10, 11)]), 5)


if __name__ == "__main__":
    unittest.main()
