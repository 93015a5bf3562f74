"""Calendar arithmetic on `datetime.date` values."""

import datetime


def is_leap(year):
    """Gregorian leap years: divisible by 4, except centuries not divisible by 400."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    if not 1 <= month <= 12:
        raise ValueError("month must be in 1..12")
    if month == 2:
        return 29 if is_leap(year) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def add_months(day, months):
    """Move `day` by `months` calendar months, clamping to the last day of the target month."""
    total = day.month - 1 + months
    year = day.year + total // 12
    month = total % 12 + 1
    return datetime.date(year, month, min(day.day, days_in_month(year, month)))


def weekdays_between(start, end):
    """Count Monday-to-Friday days in [start, end)."""
    if end < start:
        return 0
    count = 0
    current = start
    while current < end:
        if current.weekday() < 5:
            count += 1
        current += datetime.timedelta(days=1)
    return count
