"""A small dense matrix type."""


class Matrix:
    """A rectangular matrix stored as a list of rows."""

    def __init__(self, rows):
        rows = [list(row) for row in rows]
        if not rows or not rows[0]:
            raise ValueError("a matrix needs at least one row and one column")
        width = len(rows[0])
        if any(len(row) != width for row in rows):
            raise ValueError("all rows must have the same length")
        self.rows = rows

    @property
    def shape(self):
        return (len(self.rows), len(self.rows[0]))

    def __eq__(self, other):
        return isinstance(other, Matrix) and self.rows == other.rows

    def __repr__(self):
        return "Matrix(%r)" % (self.rows,)

    def __add__(self, other):
        if self.shape != other.shape:
            raise ValueError("shapes differ: %s and %s" % (self.shape, other.shape))
        return Matrix(
            [[a + b for a, b in zip(r, s)] for r, s in zip(self.rows, other.rows)]
        )

    def __matmul__(self, other):
        n, m = self.shape
        m2, p = other.shape
        if m != m2:
            raise ValueError("cannot multiply %s by %s" % (self.shape, other.shape))
        return Matrix(
            [
                [sum(self.rows[i][k] * other.rows[k][j] for k in range(m)) for j in range(p)]
                for i in range(n)
            ]
        )

    def transpose(self):
        n, m = self.shape
        return Matrix([[self.rows[i][j] for i in range(n)] for j in range(m)])

    def trace(self):
        n, m = self.shape
        if n != m:
            raise ValueError("trace needs a square matrix")
        return sum(self.rows[i][i] for i in range(n))

    def determinant(self):
        """The determinant by cofactor expansion along the first row."""
        n, m = self.shape
        if n != m:
            raise ValueError("determinant needs a square matrix")
        if n == 1:
            return self.rows[0][0]
        if n == 2:
            (a, b), (c, d) = self.rows
            return a * d - b * c
        total = 0
        for j in range(n):
            minor = Matrix([row[:j] + row[j + 1 :] for row in self.rows[1:]])
            total += (-1) ** j * self.rows[0][j] * minor.determinant()
        return total


def identity(n):
    """The n-by-n identity matrix."""
    if n < 1:
        raise ValueError("size must be at least 1")
    return Matrix([[1 if i == j else 0 for j in range(n)] for i in range(n)])
