import unittest

from lrukit.cache import LRUCache, memoize


class TestLRUCache(unittest.TestCase):
    def test_get_and_put(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        self.assertEqual(cache.get("a"), 1)
        self.assertIsNone(cache.get("zzz"))

    def test_holds_capacity_items(self):
        cache = LRUCache(3)
        for key in "abc":
            cache.put(key, key.upper())
        self.assertEqual(len(cache), 3)
        self.assertEqual(cache.keys(), ["a", "b", "c"])

    def test_evicts_least_recent(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("c", 3)
        self.assertNotIn("a", cache)
        self.assertIn("c", cache)

    def test_get_refreshes_recency(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.get("a")
        cache.put("c", 3)
        self.assertIn("a", cache)
        self.assertNotIn("b", cache)

    def test_update_refreshes_recency(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("a", 10)
        cache.put("c", 3)
        self.assertEqual(cache.peek("a"), 10)
        self.assertNotIn("b", cache)

    def test_peek_does_not_refresh(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.peek("a")
        cache.put("c", 3)
        self.assertNotIn("a", cache)

    def test_statistics(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.get("a")
        cache.get("b")
        self.assertEqual((cache.hits, cache.misses), (1, 1))

    def test_default_capacity(self):
        self.assertEqual(LRUCache().capacity, 128)

    def test_rejects_zero_capacity(self):
        with self.assertRaises(ValueError):
            LRUCache(0)


class TestMemoize(unittest.TestCase):
    def test_caches_results(self):
        calls = []

        @memoize(4)
        def square(x):
            calls.append(x)
            return x * x

        self.assertEqual(square(3), 9)
        self.assertEqual(square(3), 9)
        self.assertEqual(calls, [3])

    def test_keyword_arguments_are_part_of_the_key(self):
        @memoize(4)
        def power(x, exponent=2):
            return x ** exponent

        self.assertEqual(power(2, exponent=3), 8)
        self.assertEqual(power(2, exponent=5), 32)

    def test_caches_none_results(self):
        calls = []

        @memoize(4)
        def nothing(x):
            calls.append(x)
            return None

        nothing(1)
        nothing(1)
        self.assertEqual(calls, [1])


if __name__ == "__main__":
    unittest.main()
