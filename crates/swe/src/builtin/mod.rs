//! The built-in instances: five small Python packages the project wrote, each with a
//! `unittest` suite, and seeded bugs planted in them.
//!
//! Each bug is a replacement of one correct snippet by a wrong one (an off-by-one, a wrong
//! comparison, a missing edge case, a wrong default). An instance is the package with one bug
//! planted (or, for the harder seeded instances, two bugs of the same package); its gold patch
//! is the diff back to the correct code, FAIL_TO_PASS the tests the bug breaks, and
//! PASS_TO_PASS every other test of the package. The integration tests check all of this
//! against `python3`.

use std::collections::BTreeMap;

use harness_core::Split;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use super::diff;
use super::instance::SweInstance;

/// The seed of the generator that combines bugs into two-bug instances.
pub const PAIR_SEED: u64 = 2026;

struct Package {
    name: &'static str,
    files: &'static [(&'static str, &'static str)],
    /// The package's tests as calls (`specs/<name>.json`: test id -> steps), one per unittest
    /// method of its test files; the verifier judges these ([`super::judge`]).
    calls: &'static str,
}

macro_rules! repo_file {
    ($pkg:literal, $path:literal) => {
        ($path, include_str!(concat!("repos/", $pkg, "/", $path)))
    };
}

const PACKAGES: &[Package] = &[
    Package {
        name: "textkit",
        calls: include_str!("specs/textkit.json"),
        files: &[
            repo_file!("textkit", "README.md"),
            repo_file!("textkit", "textkit/__init__.py"),
            repo_file!("textkit", "textkit/core.py"),
            repo_file!("textkit", "tests/__init__.py"),
            repo_file!("textkit", "tests/test_core.py"),
        ],
    },
    Package {
        name: "spans",
        calls: include_str!("specs/spans.json"),
        files: &[
            repo_file!("spans", "README.md"),
            repo_file!("spans", "spans/__init__.py"),
            repo_file!("spans", "spans/interval.py"),
            repo_file!("spans", "spans/dates.py"),
            repo_file!("spans", "tests/__init__.py"),
            repo_file!("spans", "tests/test_interval.py"),
            repo_file!("spans", "tests/test_dates.py"),
        ],
    },
    Package {
        name: "confkit",
        calls: include_str!("specs/confkit.json"),
        files: &[
            repo_file!("confkit", "README.md"),
            repo_file!("confkit", "confkit/__init__.py"),
            repo_file!("confkit", "confkit/ini.py"),
            repo_file!("confkit", "confkit/csvline.py"),
            repo_file!("confkit", "tests/__init__.py"),
            repo_file!("confkit", "tests/test_ini.py"),
            repo_file!("confkit", "tests/test_csvline.py"),
        ],
    },
    Package {
        name: "lrukit",
        calls: include_str!("specs/lrukit.json"),
        files: &[
            repo_file!("lrukit", "README.md"),
            repo_file!("lrukit", "lrukit/__init__.py"),
            repo_file!("lrukit", "lrukit/cache.py"),
            repo_file!("lrukit", "tests/__init__.py"),
            repo_file!("lrukit", "tests/test_cache.py"),
        ],
    },
    Package {
        name: "matkit",
        calls: include_str!("specs/matkit.json"),
        files: &[
            repo_file!("matkit", "README.md"),
            repo_file!("matkit", "matkit/__init__.py"),
            repo_file!("matkit", "matkit/matrix.py"),
            repo_file!("matkit", "tests/__init__.py"),
            repo_file!("matkit", "tests/test_matrix.py"),
        ],
    },
];

/// A planted bug: `fixed` (unique in `file`) is replaced by `buggy`.
struct Bug {
    package: &'static str,
    slug: &'static str,
    file: &'static str,
    fixed: &'static str,
    buggy: &'static str,
    fail_to_pass: &'static [&'static str],
    statement: &'static str,
}

const BUGS: &[Bug] = &[
    // textkit
    Bug {
        package: "textkit",
        slug: "truncate-exact-width",
        file: "textkit/core.py",
        fixed: "    if len(text) <= width:\n        return text\n",
        buggy: "    if len(text) < width:\n        return text\n",
        fail_to_pass: &["tests.test_core.TestTruncate.test_exact_width_unchanged"],
        statement: "`truncate` cuts text that already fits\n\n`textkit.truncate(\"hello\", 5)` returns `\"he...\"`, but the text is exactly 5 characters long and fits the width, so it should come back unchanged. Only text longer than `width` should be cut.",
    },
    Bug {
        package: "textkit",
        slug: "wrap-exact-fit",
        file: "textkit/core.py",
        fixed: "len(current) + 1 + len(word) <= width:",
        buggy: "len(current) + 1 + len(word) < width:",
        fail_to_pass: &["tests.test_core.TestWrap.test_exact_fit_stays_on_one_line"],
        statement: "`wrap` breaks lines that fit exactly\n\nWith `wrap(\"aaa bbb\", 7)` I expect `[\"aaa bbb\"]` (the line is exactly 7 characters), but I get `[\"aaa\", \"bbb\"]`. Lines of exactly `width` characters should be allowed.",
    },
    Bug {
        package: "textkit",
        slug: "slugify-digits",
        file: "textkit/core.py",
        fixed: "re.findall(r\"[a-z0-9]+\", text.lower())",
        buggy: "re.findall(r\"[a-z]+\", text.lower())",
        fail_to_pass: &["tests.test_core.TestSlugify.test_digits_are_kept"],
        statement: "slugify drops numbers\n\n`slugify(\"Release 2 of 10\")` gives `\"release-of\"`. Digits are part of a slug: the expected result is `\"release-2-of-10\"`.",
    },
    Bug {
        package: "textkit",
        slug: "palindrome-case",
        file: "textkit/core.py",
        fixed: "cleaned = [c.lower() for c in text if c.isalnum()]",
        buggy: "cleaned = [c for c in text if c.isalnum()]",
        fail_to_pass: &[
            "tests.test_core.TestPalindrome.test_mixed_case",
            "tests.test_core.TestPalindrome.test_sentence",
        ],
        statement: "is_palindrome is case sensitive\n\nThe docstring says case is ignored, yet `is_palindrome(\"Racecar\")` is `False`, and so is the classic \"A man, a plan, a canal: Panama\".",
    },
    Bug {
        package: "textkit",
        slug: "camel-acronym",
        file: "textkit/core.py",
        fixed: "            if follows_lower or ends_acronym:\n",
        buggy: "            if follows_lower:\n",
        fail_to_pass: &["tests.test_core.TestCamelToSnake.test_acronym"],
        statement: "camel_to_snake mangles acronyms\n\n`camel_to_snake(\"HTTPServer\")` returns `\"httpserver\"`; the documented result is `\"http_server\"` (an acronym followed by a capitalised word gets an underscore before the word).",
    },
    // spans
    Bug {
        package: "spans",
        slug: "contains-end",
        file: "spans/interval.py",
        fixed: "return self.start <= x < self.end",
        buggy: "return self.start <= x <= self.end",
        fail_to_pass: &["tests.test_interval.TestInterval.test_contains_end_excluded"],
        statement: "Interval.contains includes the end point\n\nIntervals are documented as half-open, `[start, end)`, but `Interval(1, 4).contains(4)` returns `True`.",
    },
    Bug {
        package: "spans",
        slug: "merge-touching",
        file: "spans/interval.py",
        fixed: "if result and iv.start <= result[-1].end:",
        buggy: "if result and iv.start < result[-1].end:",
        fail_to_pass: &["tests.test_interval.TestMerge.test_merges_touching"],
        statement: "merge leaves touching intervals apart\n\n`merge([Interval(1, 3), Interval(3, 6)])` returns two intervals. The docstring promises that touching intervals are merged, so the result should be `[Interval(1, 6)]`.",
    },
    Bug {
        package: "spans",
        slug: "leap-400",
        file: "spans/dates.py",
        fixed: "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
        buggy: "return year % 4 == 0 and year % 100 != 0",
        fail_to_pass: &["tests.test_dates.TestLeap.test_every_400_years_leap"],
        statement: "is_leap(2000) is False\n\nThe year 2000 was a leap year (centuries divisible by 400 are leap years in the Gregorian calendar), but `spans.is_leap(2000)` returns `False`.",
    },
    Bug {
        package: "spans",
        slug: "add-months-clamp",
        file: "spans/dates.py",
        fixed: "datetime.date(year, month, min(day.day, days_in_month(year, month)))",
        buggy: "datetime.date(year, month, day.day)",
        fail_to_pass: &["tests.test_dates.TestAddMonths.test_clamps_to_month_end"],
        statement: "add_months crashes at the end of the month\n\n`add_months(date(2023, 1, 31), 1)` raises `ValueError: day is out of range for month`. It should clamp to the last day of February and return `date(2023, 2, 28)`.",
    },
    Bug {
        package: "spans",
        slug: "overlaps-touching",
        file: "spans/interval.py",
        fixed: "return self.start < other.end and other.start < self.end",
        buggy: "return self.start <= other.end and other.start <= self.end",
        fail_to_pass: &[
            "tests.test_interval.TestInterval.test_touching_do_not_overlap",
            "tests.test_interval.TestInterval.test_intersection_of_touching_is_none",
        ],
        statement: "Touching intervals are reported as overlapping\n\n`Interval(0, 5).overlaps(Interval(5, 9))` is `True` and their intersection is an empty `Interval(5, 5)`. Half-open intervals that only touch share no point: `overlaps` should be `False` and `intersection` should return `None`.",
    },
    Bug {
        package: "spans",
        slug: "weekdays-saturday",
        file: "spans/dates.py",
        fixed: "if current.weekday() < 5:",
        buggy: "if current.weekday() <= 5:",
        fail_to_pass: &[
            "tests.test_dates.TestWeekdays.test_one_week",
            "tests.test_dates.TestWeekdays.test_weekend_only",
        ],
        statement: "weekdays_between counts Saturdays\n\nA full week from Monday gives 6 instead of 5, and a Saturday-Sunday range gives 1 instead of 0.",
    },
    // confkit
    Bug {
        package: "confkit",
        slug: "ini-value-equals",
        file: "confkit/ini.py",
        fixed: "key, value = line.split(\"=\", 1)",
        buggy: "key, value = line.split(\"=\")[:2]",
        fail_to_pass: &["tests.test_ini.TestParse.test_value_with_equals_sign"],
        statement: "INI values containing `=` are cut\n\nThe entry `url = https://example.org/?a=1&b=2` is read as `https://example.org/?a`. Only the first `=` separates the key from the value.",
    },
    Bug {
        package: "confkit",
        slug: "ini-line-numbers",
        file: "confkit/ini.py",
        fixed: "enumerate(text.splitlines(), start=1)",
        buggy: "enumerate(text.splitlines())",
        fail_to_pass: &["tests.test_ini.TestParse.test_error_line_number"],
        statement: "ParseError reports the wrong line\n\nFor a file whose third line is broken, `ParseError.line_no` is 2. Line numbers in error messages should start at 1 like an editor's.",
    },
    Bug {
        package: "confkit",
        slug: "ini-bool-default",
        file: "confkit/ini.py",
        fixed: "def get_bool(data, section, key, default=False):",
        buggy: "def get_bool(data, section, key, default=True):",
        fail_to_pass: &["tests.test_ini.TestGetters.test_get_bool_missing_uses_default"],
        statement: "get_bool treats missing options as enabled\n\n`get_bool(config, \"server\", \"verbose\")` returns `True` when `verbose` is not set at all. A missing flag should default to `False`.",
    },
    Bug {
        package: "confkit",
        slug: "ini-semicolon-comments",
        file: "confkit/ini.py",
        fixed: "if not line or line[0] in \"#;\":",
        buggy: "if not line or line[0] == \"#\":",
        fail_to_pass: &["tests.test_ini.TestParse.test_semicolon_comment"],
        statement: "Comments starting with `;` are rejected\n\nThe module documents both `#` and `;` comments, but `parse(\"; note\\n[a]\\nx = 1\\n\")` raises `ParseError: line 1: expected key = value`.",
    },
    Bug {
        package: "confkit",
        slug: "csv-escaped-quote",
        file: "confkit/csvline.py",
        fixed: "            if ch == '\"':\n                if i + 1 < len(line) and line[i + 1] == '\"':\n                    field.append('\"')\n                    i += 1\n                else:\n                    in_quotes = False\n",
        buggy: "            if ch == '\"':\n                in_quotes = False\n",
        fail_to_pass: &["tests.test_csvline.TestSplitLine.test_escaped_quote"],
        statement: "Doubled quotes inside quoted CSV fields are lost\n\n`split_line('\"say \"\"hi\"\"\",2')` should give `['say \"hi\"', '2']` (a doubled quote inside a quoted field stands for one quote), but the quotes disappear.",
    },
    Bug {
        package: "confkit",
        slug: "csv-trailing-field",
        file: "confkit/csvline.py",
        fixed: "    fields.append(\"\".join(field))\n    return fields\n",
        buggy: "    if field:\n        fields.append(\"\".join(field))\n    return fields\n",
        fail_to_pass: &[
            "tests.test_csvline.TestSplitLine.test_trailing_empty_field",
            "tests.test_csvline.TestSplitLine.test_empty_line_is_one_empty_field",
        ],
        statement: "split_line drops an empty last field\n\n`split_line(\"a,b,\")` returns `['a', 'b']` but the line has three fields, the last one empty: `['a', 'b', '']`. Likewise an empty line should be one empty field.",
    },
    // lrukit
    Bug {
        package: "lrukit",
        slug: "evict-off-by-one",
        file: "lrukit/cache.py",
        fixed: "if len(self._data) > self.capacity:",
        buggy: "if len(self._data) >= self.capacity:",
        fail_to_pass: &[
            "tests.test_cache.TestLRUCache.test_holds_capacity_items",
            "tests.test_cache.TestLRUCache.test_get_refreshes_recency",
            "tests.test_cache.TestLRUCache.test_update_refreshes_recency",
        ],
        statement: "LRUCache holds one entry fewer than its capacity\n\nAfter three `put`s into `LRUCache(3)` only two entries are left. A cache of capacity n should hold n entries before evicting.",
    },
    Bug {
        package: "lrukit",
        slug: "get-refresh",
        file: "lrukit/cache.py",
        fixed: "            self._data.move_to_end(key)\n            self.hits += 1\n",
        buggy: "            self.hits += 1\n",
        fail_to_pass: &["tests.test_cache.TestLRUCache.test_get_refreshes_recency"],
        statement: "Reading an entry does not make it recently used\n\nIn an `LRUCache(2)` holding `a` and `b`, `get(\"a\")` followed by `put(\"c\", 3)` evicts `a`. A read counts as a use, so `b` should be evicted instead.",
    },
    Bug {
        package: "lrukit",
        slug: "update-refresh",
        file: "lrukit/cache.py",
        fixed: "        if key in self._data:\n            self._data.move_to_end(key)\n        self._data[key] = value\n",
        buggy: "        self._data[key] = value\n",
        fail_to_pass: &["tests.test_cache.TestLRUCache.test_update_refreshes_recency"],
        statement: "Updating an entry does not refresh it\n\nOverwriting an existing key with `put` leaves it where it was in the eviction order, so a freshly updated value can be evicted next. `put` should make the key the most recently used.",
    },
    Bug {
        package: "lrukit",
        slug: "memoize-kwargs",
        file: "lrukit/cache.py",
        fixed: "key = (args, tuple(sorted(kwargs.items())))",
        buggy: "key = args",
        fail_to_pass: &["tests.test_cache.TestMemoize.test_keyword_arguments_are_part_of_the_key"],
        statement: "memoize ignores keyword arguments\n\nA memoised `power(x, exponent=2)` returns 8 for `power(2, exponent=5)` after `power(2, exponent=3)` was called. Keyword arguments must be part of the cache key.",
    },
    Bug {
        package: "lrukit",
        slug: "default-capacity",
        file: "lrukit/cache.py",
        fixed: "def __init__(self, capacity=128):",
        buggy: "def __init__(self, capacity=16):",
        fail_to_pass: &["tests.test_cache.TestLRUCache.test_default_capacity"],
        statement: "Default LRUCache capacity is wrong\n\nThe documented default capacity is 128 (the same as `memoize`'s), but `LRUCache().capacity` is 16.",
    },
    Bug {
        package: "lrukit",
        slug: "memoize-none",
        file: "lrukit/cache.py",
        fixed: "            missing = object()\n            value = cache.get(key, missing)\n            if value is missing:\n",
        buggy: "            value = cache.get(key)\n            if value is None:\n",
        fail_to_pass: &["tests.test_cache.TestMemoize.test_caches_none_results"],
        statement: "memoize recomputes functions that return None\n\nA memoised function that returns `None` is called again on every call with the same arguments. `None` is a result like any other and should be cached.",
    },
    // matkit
    Bug {
        package: "matkit",
        slug: "ragged-rows",
        file: "matkit/matrix.py",
        fixed: "        width = len(rows[0])\n        if any(len(row) != width for row in rows):\n            raise ValueError(\"all rows must have the same length\")\n",
        buggy: "",
        fail_to_pass: &["tests.test_matrix.TestConstruction.test_rejects_ragged_rows"],
        statement: "Matrix accepts rows of different lengths\n\n`Matrix([[1, 2], [3]])` builds a broken matrix instead of raising `ValueError`; later operations then fail with confusing `IndexError`s.",
    },
    Bug {
        package: "matkit",
        slug: "matmul-shape-check",
        file: "matkit/matrix.py",
        fixed: "        if m != m2:\n",
        buggy: "        if m != p:\n",
        fail_to_pass: &[
            "tests.test_matrix.TestArithmetic.test_rectangular_product",
            "tests.test_matrix.TestArithmetic.test_product_shape_mismatch",
        ],
        statement: "Matrix product rejects valid shapes\n\n`Matrix([[1, 2, 3]]) @ Matrix([[1], [2], [3]])` raises `cannot multiply (1, 3) by (3, 1)` although a 1x3 times a 3x1 matrix is defined. Meanwhile `Matrix([[1, 2]]) @ Matrix([[1, 2]])` fails with an `IndexError` instead of the `ValueError` about shapes.",
    },
    Bug {
        package: "matkit",
        slug: "transpose-rectangular",
        file: "matkit/matrix.py",
        fixed: "[[self.rows[i][j] for i in range(n)] for j in range(m)]",
        buggy: "[[self.rows[i][j] for i in range(m)] for j in range(n)]",
        fail_to_pass: &["tests.test_matrix.TestOperations.test_transpose_rectangular"],
        statement: "transpose fails on non-square matrices\n\n`Matrix([[1, 2, 3]]).transpose()` raises `IndexError`; it should return the 3x1 matrix `[[1], [2], [3]]`.",
    },
    Bug {
        package: "matkit",
        slug: "determinant-sign",
        file: "matkit/matrix.py",
        fixed: "total += (-1) ** j * self.rows[0][j]",
        buggy: "total += (-1) ** (j + 1) * self.rows[0][j]",
        fail_to_pass: &["tests.test_matrix.TestOperations.test_determinant_3x3"],
        statement: "Wrong sign for 3x3 determinants\n\n`Matrix([[2, 0, 1], [1, 3, 2], [1, 1, 2]]).determinant()` returns -6; the determinant is 6. 2x2 matrices are fine.",
    },
    Bug {
        package: "matkit",
        slug: "add-shape-check",
        file: "matkit/matrix.py",
        fixed: "        if self.shape != other.shape:\n            raise ValueError(\"shapes differ: %s and %s\" % (self.shape, other.shape))\n",
        buggy: "",
        fail_to_pass: &["tests.test_matrix.TestArithmetic.test_add_shape_mismatch"],
        statement: "Adding matrices of different shapes silently truncates\n\n`Matrix([[1, 2]]) + Matrix([[1], [2]])` returns `Matrix([[2]])` instead of raising `ValueError`.",
    },
];

/// The split of the `index`-th bug of a package (in declaration order): three of every five
/// go to training, one to validation, one to test.
fn split_for(index: usize) -> Split {
    match index % 5 {
        3 => Split::Validation,
        4 => Split::Test,
        _ => Split::Train,
    }
}

fn package(name: &str) -> &'static Package {
    PACKAGES
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| unreachable!("every bug names a declared package"))
}

fn package_files(pkg: &Package) -> BTreeMap<String, String> {
    pkg.files
        .iter()
        .map(|(path, text)| (path.to_string(), text.to_string()))
        .collect()
}

/// Every `unittest` id in the package's `tests/test_*.py` files, found by reading the source
/// (`class Test...` at the top level, `def test_...` one level in).
pub fn discover_test_ids(files: &BTreeMap<String, String>) -> Vec<String> {
    let mut ids = Vec::new();
    for (path, text) in files {
        let Some(module) = path.strip_suffix(".py") else {
            continue;
        };
        let file_name = module.rsplit('/').next().unwrap_or_default();
        if !file_name.starts_with("test") {
            continue;
        }
        let module = module.replace('/', ".");
        let mut class = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("class ") {
                class = rest
                    .split(['(', ':'])
                    .next()
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_string);
            } else if let (Some(class), Some(rest)) = (&class, line.strip_prefix("    def test")) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                ids.push(format!("{module}.{class}.test{name}"));
            } else if !line.starts_with(' ') && !line.trim().is_empty() {
                class = None;
            }
        }
    }
    ids
}

fn plant(files: &mut BTreeMap<String, String>, bug: &Bug) {
    let text = files
        .get_mut(bug.file)
        .unwrap_or_else(|| unreachable!("bug `{}` names a file of its package", bug.slug));
    assert_eq!(
        text.matches(bug.fixed).count(),
        1,
        "bug `{}`: the fixed snippet must occur exactly once in {}",
        bug.slug,
        bug.file
    );
    *text = text.replacen(bug.fixed, bug.buggy, 1);
}

fn make_instance(instance_id: String, pkg: &Package, bugs: &[&Bug], split: Split) -> SweInstance {
    let fixed = package_files(pkg);
    let mut buggy = fixed.clone();
    for bug in bugs {
        plant(&mut buggy, bug);
    }
    let mut fail_to_pass: Vec<String> = bugs
        .iter()
        .flat_map(|b| b.fail_to_pass.iter().map(|s| s.to_string()))
        .collect();
    fail_to_pass.sort();
    fail_to_pass.dedup();
    let pass_to_pass = discover_test_ids(&fixed)
        .into_iter()
        .filter(|id| !fail_to_pass.contains(id))
        .collect();
    let problem_statement = if bugs.len() == 1 {
        bugs[0].statement.to_string()
    } else {
        let parts: Vec<String> = bugs
            .iter()
            .enumerate()
            .map(|(i, b)| format!("Problem {}: {}", i + 1, b.statement))
            .collect();
        format!(
            "Two problems were reported against `{}`; fix both.\n\n{}",
            pkg.name,
            parts.join("\n\n")
        )
    };
    let call_tests = package_calls(pkg);
    SweInstance {
        instance_id,
        repo: format!("harness-s/{}", pkg.name),
        problem_statement,
        hints_text: String::new(),
        patch: diff::diff_files(&buggy, &fixed),
        files: buggy,
        test_patch: String::new(),
        fail_to_pass,
        pass_to_pass,
        split,
        call_tests,
    }
}

/// The package's call specs, parsed.
fn package_calls(pkg: &Package) -> BTreeMap<String, Vec<serde_json::Value>> {
    serde_json::from_str(pkg.calls)
        .unwrap_or_else(|e| unreachable!("specs/{}.json is a map of id -> steps: {e}", pkg.name))
}

/// The built-in instances: one per planted bug, plus one seeded two-bug instance per package
/// (drawn from its training bugs, so no validation or test fix leaks into training). Ids are
/// `<package>__<bug>` and `<package>__pair-<bug>+<bug>`.
pub fn builtin_instances() -> Vec<SweInstance> {
    let mut rng = ChaCha8Rng::seed_from_u64(PAIR_SEED);
    let mut instances = Vec::new();
    for pkg in PACKAGES {
        let bugs: Vec<&Bug> = BUGS.iter().filter(|b| b.package == pkg.name).collect();
        for (i, bug) in bugs.iter().enumerate() {
            instances.push(make_instance(
                format!("{}__{}", pkg.name, bug.slug),
                pkg,
                &[bug],
                split_for(i),
            ));
        }
        // Two training bugs whose snippets do not overlap.
        let train: Vec<&Bug> = bugs
            .iter()
            .enumerate()
            .filter(|(i, _)| split_for(*i) == Split::Train)
            .map(|(_, b)| *b)
            .collect();
        let mut pairs: Vec<(&Bug, &Bug)> = Vec::new();
        for (i, a) in train.iter().enumerate() {
            for b in &train[i + 1..] {
                if a.file != b.file || (!a.fixed.contains(b.fixed) && !b.fixed.contains(a.fixed)) {
                    pairs.push((a, b));
                }
            }
        }
        if let Some((a, b)) = pairs.choose(&mut rng) {
            instances.push(make_instance(
                format!("{}__pair-{}+{}", pkg.name, a.slug, b.slug),
                package(pkg.name),
                &[a, b],
                Split::Train,
            ));
        }
    }
    instances
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_instances_are_well_formed() {
        let instances = builtin_instances();
        assert!(instances.len() >= 30, "{}", instances.len());
        let mut ids: Vec<&str> = instances.iter().map(|i| i.instance_id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), instances.len(), "ids are unique");
        for instance in &instances {
            instance
                .check()
                .unwrap_or_else(|(f, m)| panic!("{}: {f}: {m}", instance.instance_id));
            let all = discover_test_ids(&instance.files);
            for id in &instance.fail_to_pass {
                assert!(
                    all.contains(id),
                    "{}: unknown test {id}",
                    instance.instance_id
                );
            }
            // Every test id has its calls, so the built-in instances never need the in-process
            // unittest verdict.
            let mut ids = instance.all_tests();
            ids.sort();
            assert_eq!(
                instance.call_tests.keys().cloned().collect::<Vec<_>>(),
                ids,
                "{}",
                instance.instance_id
            );
            // The gold patch never touches tests.
            assert!(
                !instance.patch.contains("tests/"),
                "{}",
                instance.instance_id
            );
        }
        for split in Split::ALL {
            assert!(instances.iter().any(|i| i.split == split), "{split}");
        }
    }

    #[test]
    fn generation_is_deterministic() {
        assert_eq!(builtin_instances(), builtin_instances());
    }
}
