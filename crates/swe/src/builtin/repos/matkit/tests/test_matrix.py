import unittest

from matkit.matrix import Matrix, identity


class TestConstruction(unittest.TestCase):
    def test_shape(self):
        self.assertEqual(Matrix([[1, 2, 3], [4, 5, 6]]).shape, (2, 3))

    def test_rejects_empty(self):
        with self.assertRaises(ValueError):
            Matrix([])

    def test_rejects_ragged_rows(self):
        with self.assertRaises(ValueError):
            Matrix([[1, 2], [3]])

    def test_identity(self):
        self.assertEqual(identity(2), Matrix([[1, 0], [0, 1]]))


class TestArithmetic(unittest.TestCase):
    def test_add(self):
        self.assertEqual(Matrix([[1, 2]]) + Matrix([[3, 4]]), Matrix([[4, 6]]))

    def test_add_shape_mismatch(self):
        with self.assertRaises(ValueError):
            Matrix([[1, 2]]) + Matrix([[1], [2]])

    def test_square_product(self):
        a = Matrix([[1, 2], [3, 4]])
        self.assertEqual(a @ identity(2), a)
        self.assertEqual(a @ a, Matrix([[7, 10], [15, 22]]))

    def test_rectangular_product(self):
        a = Matrix([[1, 2, 3]])
        b = Matrix([[1], [2], [3]])
        self.assertEqual(a @ b, Matrix([[14]]))
        self.assertEqual((b @ a).shape, (3, 3))

    def test_product_shape_mismatch(self):
        with self.assertRaises(ValueError):
            Matrix([[1, 2]]) @ Matrix([[1, 2]])


class TestOperations(unittest.TestCase):
    def test_transpose_square(self):
        self.assertEqual(Matrix([[1, 2], [3, 4]]).transpose(), Matrix([[1, 3], [2, 4]]))

    def test_transpose_rectangular(self):
        self.assertEqual(Matrix([[1, 2, 3]]).transpose(), Matrix([[1], [2], [3]]))

    def test_trace(self):
        self.assertEqual(Matrix([[1, 2], [3, 4]]).trace(), 5)

    def test_determinant_2x2(self):
        self.assertEqual(Matrix([[1, 2], [3, 4]]).determinant(), -2)

    def test_determinant_3x3(self):
        self.assertEqual(Matrix([[2, 0, 1], [1, 3, 2], [1, 1, 2]]).determinant(), 6)

    def test_determinant_identity(self):
        self.assertEqual(identity(4).determinant(), 1)


if __name__ == "__main__":
    unittest.main()
