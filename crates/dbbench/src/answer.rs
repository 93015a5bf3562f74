//! Answer normalisation and comparison, following AgentBench's DBBench scoring.
//!
//! Each answer is trimmed, stripped of surrounding quotes, and normalised: a trailing `%` is
//! dropped, thousands separators are removed, and `None`, `null`, `nan`, `inf` and the empty
//! string all become `0`. One answer against one label: equal when both are `0`, within 1e-2
//! when both parse as numbers, else equal as strings (case-sensitive, as in AgentBench). Several
//! answers: when every item on both sides is a number, matched one-to-one within 1e-2 (same
//! count), otherwise compared as sets.

/// Absolute tolerance of numeric answers (AgentBench's newer harness).
pub const FLOAT_TOLERANCE: f64 = 1e-2;

/// Normalise one answer item.
pub fn normalize(raw: &str) -> String {
    let value = raw.trim().trim_matches(['\'', '"']);
    let value = value.trim();
    if let Some(number) = value.strip_suffix('%') {
        return number.trim().to_string();
    }
    let value = if value.contains(',') && !value.starts_with('[') && !value.ends_with(']') {
        value.replace(',', "")
    } else {
        value.to_string()
    };
    match value.to_lowercase().as_str() {
        "none" | "null" | "undefined" | "nan" | "inf" | "infinity" | "-inf" | "-infinity" | "" => {
            "0".to_string()
        }
        _ => value,
    }
}

/// A number as Python's `float()` reads it (surrounding spaces allowed; `inf`/`nan` too).
pub fn as_number(text: &str) -> Option<f64> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    t.parse::<f64>().ok()
}

fn close(a: &str, b: &str) -> bool {
    match (as_number(a), as_number(b)) {
        // `x == y` first, so that overflowing numbers (`1e999`) still equal themselves.
        (Some(x), Some(y)) => x == y || (x - y).abs() <= FLOAT_TOLERANCE,
        _ => false,
    }
}

/// Whether `answers` match `labels` (both raw; normalised here).
pub fn answers_match(answers: &[String], labels: &[String]) -> bool {
    let answers: Vec<String> = answers.iter().map(|a| normalize(a)).collect();
    let labels: Vec<String> = labels.iter().map(|l| normalize(l)).collect();
    if answers.len() == 1 && labels.len() == 1 {
        let (a, l) = (&answers[0], &labels[0]);
        if a == "0" && l == "0" {
            return true;
        }
        if as_number(a).is_some() && as_number(l).is_some() {
            return close(a, l);
        }
        return a == l;
    }
    let all_numbers = |items: &[String]| items.iter().all(|i| as_number(i).is_some());
    if all_numbers(&answers) && all_numbers(&labels) {
        if answers.len() != labels.len() {
            return false;
        }
        let mut used = vec![false; labels.len()];
        for a in &answers {
            let Some(j) = (0..labels.len()).find(|&j| !used[j] && close(a, &labels[j])) else {
                return false;
            };
            used[j] = true;
        }
        return true;
    }
    let a: std::collections::BTreeSet<&String> = answers.iter().collect();
    let l: std::collections::BTreeSet<&String> = labels.iter().collect();
    a == l
}

/// Split an answer written as text into items: a list literal (`["a", 'b', 3]`, or a result
/// like `[('a',), ('b',)]`) gives its items, tuples flattened; anything else is one item.
pub fn parse_answer_list(text: &str) -> Vec<String> {
    let t = text.trim();
    if !(t.starts_with('[') && t.ends_with(']')) || t.len() < 2 {
        return vec![t.to_string()];
    }
    let inner = &t[1..t.len() - 1];
    let mut items = Vec::new();
    let mut current = String::new();
    let mut quoted = false; // the current item was a quoted string
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                let quote = c;
                let mut s = String::new();
                let mut closed = false;
                while let Some(ch) = chars.next() {
                    if ch == '\\' {
                        match chars.next() {
                            Some('n') => s.push('\n'),
                            Some('t') => s.push('\t'),
                            Some(other) => s.push(other),
                            None => s.push('\\'),
                        }
                    } else if ch == quote {
                        closed = true;
                        break;
                    } else {
                        s.push(ch);
                    }
                }
                if !closed {
                    // An unbalanced quote: keep the text as written.
                    current.push(quote);
                }
                current.push_str(&s);
                quoted = true;
            }
            ',' => {
                let item = current.trim().to_string();
                if !item.is_empty() || quoted {
                    items.push(item);
                }
                current.clear();
                quoted = false;
            }
            '(' | ')' | '[' | ']' if !quoted => {
                // Tuple and nesting brackets separate items like commas do.
                let item = current.trim().to_string();
                if !item.is_empty() {
                    items.push(item);
                }
                current.clear();
            }
            _ => current.push(c),
        }
    }
    let item = current.trim().to_string();
    if !item.is_empty() || quoted {
        items.push(item);
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(items: &[&str]) -> Vec<String> {
        items.iter().map(|i| i.to_string()).collect()
    }

    #[test]
    fn normalisation() {
        assert_eq!(normalize(" '12%' "), "12");
        assert_eq!(normalize("1,234"), "1234");
        assert_eq!(normalize("None"), "0");
        assert_eq!(normalize(""), "0");
        assert_eq!(normalize("Giza"), "Giza");
    }

    #[test]
    fn single_values() {
        assert!(answers_match(&s(&["21000"]), &s(&["21000.0"])));
        assert!(answers_match(&s(&["3.333"]), &s(&["3.33"])));
        assert!(!answers_match(&s(&["3.4"]), &s(&["3.33"])));
        assert!(answers_match(&s(&["0"]), &s(&["none"])));
        assert!(answers_match(&s(&["Giza"]), &s(&["Giza"])));
        assert!(!answers_match(&s(&["giza"]), &s(&["Giza"])));
        assert!(answers_match(&s(&["1,000"]), &s(&["1000"])));
    }

    #[test]
    fn lists() {
        assert!(answers_match(&s(&["b", "a"]), &s(&["a", "b"])));
        assert!(answers_match(&s(&["2", "1.0"]), &s(&["1", "2"])));
        assert!(!answers_match(&s(&["1", "1"]), &s(&["1", "2"])));
        assert!(!answers_match(&[], &s(&["x"])));
        assert!(!answers_match(&[], &s(&["none"])));
        assert!(!answers_match(&s(&["a"]), &s(&["a", "b"])));
    }

    #[test]
    fn answer_lists_from_text() {
        assert_eq!(parse_answer_list(r#"["a", "b, c"]"#), s(&["a", "b, c"]));
        assert_eq!(parse_answer_list("[('x',), ('y',)]"), s(&["x", "y"]));
        assert_eq!(parse_answer_list("[1, 2.5]"), s(&["1", "2.5"]));
        assert_eq!(parse_answer_list("[\"it's\"]"), s(&["it's"]));
        assert_eq!(parse_answer_list("42"), s(&["42"]));
        assert_eq!(parse_answer_list("[]"), Vec::<String>::new());
        assert_eq!(parse_answer_list("['']"), s(&[""]));
    }
}
