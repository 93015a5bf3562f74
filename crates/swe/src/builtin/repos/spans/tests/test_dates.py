import datetime
import unittest

from spans.dates import add_months, days_in_month, is_leap, weekdays_between


class TestLeap(unittest.TestCase):
    def test_ordinary_leap(self):
        self.assertTrue(is_leap(2024))

    def test_common_year(self):
        self.assertFalse(is_leap(2023))

    def test_century_not_leap(self):
        self.assertFalse(is_leap(1900))

    def test_every_400_years_leap(self):
        self.assertTrue(is_leap(2000))


class TestDaysInMonth(unittest.TestCase):
    def test_thirty_and_thirty_one(self):
        self.assertEqual(days_in_month(2023, 4), 30)
        self.assertEqual(days_in_month(2023, 12), 31)

    def test_february(self):
        self.assertEqual(days_in_month(2023, 2), 28)
        self.assertEqual(days_in_month(2024, 2), 29)

    def test_bad_month(self):
        with self.assertRaises(ValueError):
            days_in_month(2023, 13)


class TestAddMonths(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(add_months(datetime.date(2023, 1, 15), 1), datetime.date(2023, 2, 15))

    def test_year_rollover(self):
        self.assertEqual(add_months(datetime.date(2023, 11, 3), 3), datetime.date(2024, 2, 3))

    def test_negative(self):
        self.assertEqual(add_months(datetime.date(2023, 1, 10), -2), datetime.date(2022, 11, 10))

    def test_clamps_to_month_end(self):
        self.assertEqual(add_months(datetime.date(2023, 1, 31), 1), datetime.date(2023, 2, 28))


class TestWeekdays(unittest.TestCase):
    def test_one_week(self):
        start = datetime.date(2024, 1, 1)  # a Monday
        self.assertEqual(weekdays_between(start, start + datetime.timedelta(days=7)), 5)

    def test_end_excluded(self):
        monday = datetime.date(2024, 1, 1)
        self.assertEqual(weekdays_between(monday, monday + datetime.timedelta(days=1)), 1)

    def test_weekend_only(self):
        saturday = datetime.date(2024, 1, 6)
        self.assertEqual(weekdays_between(saturday, saturday + datetime.timedelta(days=2)), 0)

    def test_reversed_is_zero(self):
        self.assertEqual(weekdays_between(datetime.date(2024, 1, 5), datetime.date(2024, 1, 1)), 0)


if __name__ == "__main__":
    unittest.main()
