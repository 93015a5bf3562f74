"""Half-open intervals and calendar arithmetic."""

from .dates import add_months, days_in_month, is_leap, weekdays_between
from .interval import Interval, merge, total_length

__all__ = [
    "Interval",
    "add_months",
    "days_in_month",
    "is_leap",
    "merge",
    "total_length",
    "weekdays_between",
]
