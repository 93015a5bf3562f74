//! Unified diffs: parsing, applying and creating them.
//!
//! Gold patches and test patches are multi-file unified diffs as `git diff` writes them
//! (`diff --git` headers optional, `a/` and `b/` prefixes stripped, `/dev/null` for created and
//! deleted files, `\ No newline at end of file` markers honoured). Applying is strict about
//! content (every context and removed line must match exactly) but tolerant about position: a
//! hunk whose line numbers are off is placed at the nearest position where it matches, as
//! `patch` does with an offset and no fuzz.

use std::collections::BTreeMap;

/// One line of a hunk. The text includes its line terminator (absent only for a last line
/// marked `\ No newline at end of file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HunkLine {
    /// A line present before and after.
    Context(String),
    /// A line the patch removes.
    Remove(String),
    /// A line the patch adds.
    Add(String),
}

/// One `@@ -a,b +c,d @@` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// First old line (1-based; for an empty old range, the line after which to insert).
    pub old_start: usize,
    /// Number of old lines.
    pub old_len: usize,
    /// First new line (1-based).
    pub new_start: usize,
    /// Number of new lines.
    pub new_len: usize,
    /// The lines.
    pub lines: Vec<HunkLine>,
}

impl Hunk {
    /// The lines the hunk expects (context and removed), in order.
    pub fn old_lines(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter_map(|l| match l {
                HunkLine::Context(s) | HunkLine::Remove(s) => Some(s.as_str()),
                HunkLine::Add(_) => None,
            })
            .collect()
    }

    /// The lines the hunk leaves (context and added), in order.
    pub fn new_lines(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter_map(|l| match l {
                HunkLine::Context(s) | HunkLine::Add(s) => Some(s.as_str()),
                HunkLine::Remove(_) => None,
            })
            .collect()
    }
}

/// The changes to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch {
    /// The path before (`None` when the file is created).
    pub old_path: Option<String>,
    /// The path after (`None` when the file is deleted).
    pub new_path: Option<String>,
    /// The hunks, in file order.
    pub hunks: Vec<Hunk>,
}

impl FilePatch {
    /// The path the patch is about (the new path, or the old one for a deletion).
    pub fn path(&self) -> &str {
        self.new_path
            .as_deref()
            .or(self.old_path.as_deref())
            .unwrap_or_default()
    }
}

/// Parse a multi-file unified diff. Text outside file sections (commit messages, `index`
/// lines, mode lines) is ignored; a malformed hunk is an error naming its line.
pub fn parse_patch(text: &str) -> Result<Vec<FilePatch>, String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut patches = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !lines[i].starts_with("--- ") {
            i += 1;
            continue;
        }
        let old_path = header_path(lines[i], "--- ", "a/");
        let Some(next) = lines.get(i + 1).filter(|l| l.starts_with("+++ ")) else {
            return Err(format!(
                "line {}: `---` header is not followed by a `+++` header",
                i + 1
            ));
        };
        let new_path = header_path(next, "+++ ", "b/");
        if old_path.is_none() && new_path.is_none() {
            return Err(format!("line {}: both paths are /dev/null", i + 1));
        }
        i += 2;
        let mut hunks = Vec::new();
        while i < lines.len() && lines[i].starts_with("@@") {
            let (hunk, next) = parse_hunk(&lines, i)?;
            hunks.push(hunk);
            i = next;
        }
        if hunks.is_empty() {
            return Err(format!(
                "line {}: file section without any `@@` hunk",
                i + 1
            ));
        }
        patches.push(FilePatch {
            old_path,
            new_path,
            hunks,
        });
    }
    Ok(patches)
}

fn header_path(line: &str, marker: &str, prefix: &str) -> Option<String> {
    let rest = line[marker.len()..].trim_end_matches(['\n', '\r']);
    // A timestamp may follow the path after a tab (`diff -u` output).
    let path = rest.split('\t').next().unwrap_or_default().trim_end();
    if path == "/dev/null" {
        return None;
    }
    Some(path.strip_prefix(prefix).unwrap_or(path).to_string())
}

fn parse_range(text: &str) -> Option<(usize, usize)> {
    match text.split_once(',') {
        Some((start, len)) => Some((start.parse().ok()?, len.parse().ok()?)),
        None => Some((text.parse().ok()?, 1)),
    }
}

fn parse_hunk(lines: &[&str], at: usize) -> Result<(Hunk, usize), String> {
    let header = lines[at].trim_end();
    let bad = || format!("line {}: malformed hunk header `{header}`", at + 1);
    let inner = header
        .strip_prefix("@@ -")
        .and_then(|h| h.split_once(" @@").map(|(ranges, _)| ranges))
        .ok_or_else(bad)?;
    let (old, new) = inner.split_once(" +").ok_or_else(bad)?;
    let (old_start, old_len) = parse_range(old).ok_or_else(bad)?;
    let (new_start, new_len) = parse_range(new).ok_or_else(bad)?;
    let mut hunk = Hunk {
        old_start,
        old_len,
        new_start,
        new_len,
        lines: Vec::new(),
    };
    let (mut seen_old, mut seen_new) = (0, 0);
    let mut i = at + 1;
    while seen_old < old_len || seen_new < new_len {
        let Some(line) = lines.get(i) else {
            return Err(format!(
                "line {}: hunk ends early (expected {old_len} old and {new_len} new lines)",
                at + 1
            ));
        };
        let first = line.chars().next().map_or(0, char::len_utf8);
        let (kind, body) = line.split_at(first);
        match kind {
            " " => {
                hunk.lines.push(HunkLine::Context(body.to_string()));
                seen_old += 1;
                seen_new += 1;
            }
            // Some tools strip the space of an empty context line.
            "\n" | "\r" => {
                hunk.lines.push(HunkLine::Context(line.to_string()));
                seen_old += 1;
                seen_new += 1;
            }
            "-" => {
                hunk.lines.push(HunkLine::Remove(body.to_string()));
                seen_old += 1;
            }
            "+" => {
                hunk.lines.push(HunkLine::Add(body.to_string()));
                seen_new += 1;
            }
            "\\" => strip_last_newline(&mut hunk.lines),
            _ => {
                return Err(format!(
                    "line {}: unexpected line in hunk (expected ' ', '-', '+' or '\\')",
                    i + 1
                ));
            }
        }
        i += 1;
    }
    if seen_old != old_len || seen_new != new_len {
        return Err(format!(
            "line {}: hunk has more lines than its header announces",
            at + 1
        ));
    }
    while lines.get(i).is_some_and(|l| l.starts_with('\\')) {
        strip_last_newline(&mut hunk.lines);
        i += 1;
    }
    Ok((hunk, i))
}

fn strip_last_newline(lines: &mut [HunkLine]) {
    if let Some(HunkLine::Context(s) | HunkLine::Remove(s) | HunkLine::Add(s)) = lines.last_mut()
        && s.ends_with('\n')
    {
        s.pop();
        if s.ends_with('\r') {
            s.pop();
        }
    }
}

/// Where each hunk of a file patch applies: the 0-based first old line, in hunk order.
pub fn locate_hunks(text: &str, hunks: &[Hunk]) -> Result<Vec<usize>, String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut positions = Vec::with_capacity(hunks.len());
    let mut floor = 0usize;
    let mut offset: isize = 0;
    for (n, hunk) in hunks.iter().enumerate() {
        let old = hunk.old_lines();
        let nominal = if old.is_empty() {
            hunk.old_start
        } else {
            hunk.old_start.saturating_sub(1)
        };
        let expected = (nominal as isize + offset).max(0) as usize;
        let fits = |at: usize| {
            at >= floor
                && at + old.len() <= lines.len()
                && lines[at..at + old.len()]
                    .iter()
                    .zip(&old)
                    .all(|(a, b)| a == b)
        };
        let max_distance = lines.len() + 1;
        let found = (0..=max_distance).find_map(|d| {
            if fits(expected + d) {
                Some(expected + d)
            } else if d > 0 && d <= expected && fits(expected - d) {
                Some(expected - d)
            } else {
                None
            }
        });
        let Some(at) = found else {
            return Err(format!(
                "hunk {} (@@ -{},{} @@) does not match the file",
                n + 1,
                hunk.old_start,
                hunk.old_len
            ));
        };
        offset = at as isize - nominal as isize;
        floor = at + old.len();
        positions.push(at);
    }
    Ok(positions)
}

/// Apply the hunks of one file patch to `text`.
pub fn apply_hunks(text: &str, hunks: &[Hunk]) -> Result<String, String> {
    let positions = locate_hunks(text, hunks)?;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut out = String::with_capacity(text.len());
    let mut next = 0;
    for (hunk, at) in hunks.iter().zip(positions) {
        for line in &lines[next..at] {
            out.push_str(line);
        }
        for line in hunk.new_lines() {
            out.push_str(line);
        }
        next = at + hunk.old_lines().len();
    }
    for line in &lines[next..] {
        out.push_str(line);
    }
    Ok(out)
}

/// Apply a multi-file patch to a tree of files held in memory. Nothing changes on error.
pub fn apply_to_files(files: &mut BTreeMap<String, String>, patch: &str) -> Result<(), String> {
    let patches = parse_patch(patch)?;
    let mut result = files.clone();
    for fp in &patches {
        match (&fp.old_path, &fp.new_path) {
            (None, Some(new)) => {
                if result.contains_key(new) {
                    return Err(format!("`{new}`: the patch creates a file that exists"));
                }
                let text = apply_hunks("", &fp.hunks).map_err(|e| format!("`{new}`: {e}"))?;
                result.insert(new.clone(), text);
            }
            (Some(old), new) => {
                let Some(current) = result.get(old) else {
                    return Err(format!("`{old}`: the patch changes a file that is missing"));
                };
                let text = apply_hunks(current, &fp.hunks).map_err(|e| format!("`{old}`: {e}"))?;
                match new {
                    None => {
                        if !text.is_empty() {
                            return Err(format!(
                                "`{old}`: the patch deletes the file but leaves lines in it"
                            ));
                        }
                        result.remove(old);
                    }
                    Some(new) => {
                        if new != old {
                            result.remove(old);
                        }
                        result.insert(new.clone(), text);
                    }
                }
            }
            (None, None) => unreachable!("rejected by the parser"),
        }
    }
    *files = result;
    Ok(())
}

/// A unified diff of one file from `old` to `new` with `context` lines around each change, in
/// `git diff` form. `None` for `old` creates the file; `None` for `new` deletes it. Empty when
/// nothing changed.
pub fn unified_diff(path: &str, old: Option<&str>, new: Option<&str>, context: usize) -> String {
    let a: Vec<&str> = old.unwrap_or_default().split_inclusive('\n').collect();
    let b: Vec<&str> = new.unwrap_or_default().split_inclusive('\n').collect();
    if old == new {
        return String::new();
    }
    let ops = line_diff(&a, &b);
    // Group changes into hunks with `context` lines of context, merging close ones.
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| !matches!(op, Op::Same(..)))
        .map(|(i, _)| i)
        .collect();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for &i in &changed {
        let start = i.saturating_sub(context);
        let end = (i + context + 1).min(ops.len());
        match ranges.last_mut() {
            Some(last) if start <= last.1 => last.1 = end,
            _ => ranges.push((start, end)),
        }
    }
    let mut out = format!("diff --git a/{path} b/{path}\n");
    match old {
        Some(_) => out.push_str(&format!("--- a/{path}\n")),
        None => out.push_str("--- /dev/null\n"),
    }
    match new {
        Some(_) => out.push_str(&format!("+++ b/{path}\n")),
        None => out.push_str("+++ /dev/null\n"),
    }
    // Line numbers before each op.
    let mut old_no = Vec::with_capacity(ops.len() + 1);
    let mut new_no = Vec::with_capacity(ops.len() + 1);
    let (mut x, mut y) = (0usize, 0usize);
    for op in &ops {
        old_no.push(x);
        new_no.push(y);
        match op {
            Op::Same(..) => {
                x += 1;
                y += 1;
            }
            Op::Del(_) => x += 1,
            Op::Ins(_) => y += 1,
        }
    }
    for (start, end) in ranges {
        let slice = &ops[start..end];
        let old_len = slice.iter().filter(|o| !matches!(o, Op::Ins(_))).count();
        let new_len = slice.iter().filter(|o| !matches!(o, Op::Del(_))).count();
        let old_start = if old_len == 0 {
            old_no[start]
        } else {
            old_no[start] + 1
        };
        let new_start = if new_len == 0 {
            new_no[start]
        } else {
            new_no[start] + 1
        };
        out.push_str(&format!(
            "@@ -{old_start},{old_len} +{new_start},{new_len} @@\n"
        ));
        for op in slice {
            let (mark, line) = match op {
                Op::Same(i) => (' ', a[*i]),
                Op::Del(i) => ('-', a[*i]),
                Op::Ins(j) => ('+', b[*j]),
            };
            out.push(mark);
            out.push_str(line);
            if !line.ends_with('\n') {
                out.push_str("\n\\ No newline at end of file\n");
            }
        }
    }
    out
}

/// A patch turning the `old` tree into the `new` tree (files in path order).
pub fn diff_files(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> String {
    let mut paths: Vec<&String> = old.keys().chain(new.keys()).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .map(|p| {
            unified_diff(
                p,
                old.get(p).map(String::as_str),
                new.get(p).map(String::as_str),
                3,
            )
        })
        .collect()
}

enum Op {
    Same(usize),
    Del(usize),
    Ins(usize),
}

/// A shortest edit script by longest common subsequence (files here are small; common prefix
/// and suffix are trimmed first so typical one-line fixes cost almost nothing).
fn line_diff(a: &[&str], b: &[&str]) -> Vec<Op> {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let am = &a[prefix..a.len() - suffix];
    let bm = &b[prefix..b.len() - suffix];
    let (n, m) = (am.len(), bm.len());
    // lcs[i][j] = LCS length of am[i..] and bm[j..].
    let mut lcs = vec![0u32; (n + 1) * (m + 1)];
    let idx = |i: usize, j: usize| i * (m + 1) + j;
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[idx(i, j)] = if am[i] == bm[j] {
                lcs[idx(i + 1, j + 1)] + 1
            } else {
                lcs[idx(i + 1, j)].max(lcs[idx(i, j + 1)])
            };
        }
    }
    let mut ops: Vec<Op> = (0..prefix).map(Op::Same).collect();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && am[i] == bm[j] {
            ops.push(Op::Same(prefix + i));
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[idx(i, j + 1)] >= lcs[idx(i + 1, j)]) {
            ops.push(Op::Ins(prefix + j));
            j += 1;
        } else {
            ops.push(Op::Del(prefix + i));
            i += 1;
        }
    }
    // Deletions before insertions inside a change block reads like `git diff`.
    normalise_blocks(&mut ops);
    for k in 0..suffix {
        ops.push(Op::Same(a.len() - suffix + k));
    }
    ops
}

fn normalise_blocks(ops: &mut [Op]) {
    let mut start = 0;
    while start < ops.len() {
        if matches!(ops[start], Op::Same(..)) {
            start += 1;
            continue;
        }
        let mut end = start;
        while end < ops.len() && !matches!(ops[end], Op::Same(..)) {
            end += 1;
        }
        ops[start..end].sort_by_key(|op| match op {
            Op::Del(i) => (0, *i),
            Op::Ins(j) => (1, *j),
            Op::Same(..) => (2, 0),
        });
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_simple_change() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nC\nd\ne\nf\ng\nh\ni\n";
        let patch = unified_diff("x.py", Some(old), Some(new), 3);
        assert!(patch.contains("-c\n+C\n"), "{patch}");
        let fps = parse_patch(&patch).unwrap();
        assert_eq!(apply_hunks(old, &fps[0].hunks).unwrap(), new);
    }

    #[test]
    fn creates_and_deletes_files() {
        let mut files = BTreeMap::from([("gone.py".to_string(), "x = 1\n".to_string())]);
        let mut target = BTreeMap::from([("new/mod.py".to_string(), "y = 2".to_string())]);
        let patch = diff_files(&files, &target);
        assert!(patch.contains("--- /dev/null") && patch.contains("+++ /dev/null"));
        assert!(patch.contains("\\ No newline at end of file"));
        apply_to_files(&mut files, &patch).unwrap();
        assert_eq!(files, target);
        target.clear();
    }

    #[test]
    fn hunks_apply_with_an_offset_but_not_with_wrong_content() {
        let old = "1\n2\n3\n4\n5\n";
        let patch = "--- a/f\n+++ b/f\n@@ -3,2 +3,2 @@\n 3\n-4\n+four\n";
        let fps = parse_patch(patch).unwrap();
        let shifted = format!("0\n0\n{old}");
        assert_eq!(
            apply_hunks(&shifted, &fps[0].hunks).unwrap(),
            "0\n0\n1\n2\n3\nfour\n5\n"
        );
        assert!(apply_hunks("1\n2\n3\nX\n5\n", &fps[0].hunks).is_err());
    }

    #[test]
    fn malformed_patches_are_errors() {
        for bad in [
            "--- a/f\n",
            "--- a/f\n+++ b/f\n",
            "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n",
            "--- a/f\n+++ b/f\n@@ nonsense @@\n",
            "--- a/f\n+++ b/f\n@@ -1,1 +1,1 @@\n?x\n",
            "--- a/f\n+++ b/f\n@@ -1,1 +1,1 @@\néx\n",
            "--- /dev/null\n+++ /dev/null\n@@ -0,0 +1,1 @@\n+x\n",
        ] {
            assert!(parse_patch(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn diff_then_apply_round_trips(
            old in proptest::collection::vec("[abcé]{0,2}", 0..30),
            new in proptest::collection::vec("[abcé]{0,2}", 0..30),
            old_eol in any::<bool>(),
            new_eol in any::<bool>(),
        ) {
            let join = |lines: &[String], eol: bool| {
                let mut s = lines.join("\n");
                if eol && !s.is_empty() { s.push('\n'); }
                s
            };
            let (old, new) = (join(&old, old_eol), join(&new, new_eol));
            let patch = unified_diff("f", Some(&old), Some(&new), 3);
            if old == new {
                prop_assert!(patch.is_empty());
            } else {
                let fps = parse_patch(&patch).map_err(TestCaseError::fail)?;
                prop_assert_eq!(fps.len(), 1);
                prop_assert_eq!(apply_hunks(&old, &fps[0].hunks).map_err(TestCaseError::fail)?, new);
            }
        }

        #[test]
        fn parser_never_panics(text in "[-+ @\\\\a-c,0-9\né]{0,200}") {
            let _ = parse_patch(&text);
            let _ = parse_patch(&format!("--- a/f\n+++ b/f\n{text}"));
        }
    }
}
