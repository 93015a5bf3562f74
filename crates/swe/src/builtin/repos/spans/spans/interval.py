"""Half-open intervals [start, end) over numbers."""


class Interval:
    """The numbers x with start <= x < end."""

    def __init__(self, start, end):
        if end < start:
            raise ValueError("end must not be before start")
        self.start = start
        self.end = end

    @property
    def length(self):
        return self.end - self.start

    def contains(self, x):
        """Whether `x` lies in the interval (the end is excluded)."""
        return self.start <= x < self.end

    def overlaps(self, other):
        """Whether the two intervals share at least one point."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other):
        """The common part, or None when the intervals do not overlap."""
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))

    def __eq__(self, other):
        return (
            isinstance(other, Interval)
            and self.start == other.start
            and self.end == other.end
        )

    def __repr__(self):
        return "Interval(%r, %r)" % (self.start, self.end)


def merge(intervals):
    """Merge overlapping or touching intervals into a sorted list of disjoint ones."""
    result = []
    for iv in sorted(intervals, key=lambda i: (i.start, i.end)):
        if result and iv.start <= result[-1].end:
            last = result[-1]
            result[-1] = Interval(last.start, max(last.end, iv.end))
        else:
            result.append(Interval(iv.start, iv.end))
    return result


def total_length(intervals):
    """The length of the union of `intervals`."""
    return sum(iv.length for iv in merge(intervals))
