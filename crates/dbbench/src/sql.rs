//! Translating the MySQL dialect DBBench's SQL is written in into SQLite.
//!
//! A small lexer reads one statement the way MySQL does (backslash escapes in string literals,
//! double-quoted strings, backticks, `#` comments, identifiers that start with a digit) and
//! writes it back for SQLite. On the way it makes comparisons between a column and a numeric
//! literal numeric, as MySQL does for TEXT columns, by wrapping the column in `mysql_num(...)`
//! (see [`super::db`]). Statements MySQL users type to look around (`SHOW TABLES`,
//! `DESCRIBE t`, `SHOW CREATE TABLE t`) are recognised and answered by the session itself.

use std::collections::BTreeSet;

/// One lexical token of MySQL-flavoured SQL.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    /// Spaces, tabs and newlines (kept as written); comments become a single space.
    Space(String),
    /// A bare word: a keyword or an unquoted identifier.
    Word(String),
    /// An identifier that must be quoted for SQLite: backticked, bracketed, or a bare one that
    /// starts with a digit.
    Ident(String),
    /// A `"..."` token: a string in MySQL, an identifier when it names a known table or column.
    DoubleQuoted(String),
    /// A `'...'` string literal, escapes already resolved.
    Str(String),
    /// A numeric literal as written.
    Number(String),
    /// An operator or punctuation (`<=`, `(`, `,`, ...).
    Punct(String),
    /// The statement separator.
    Semicolon,
}

impl Token {
    fn is_space(&self) -> bool {
        matches!(self, Token::Space(_))
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self, Token::Word(w) if w.eq_ignore_ascii_case(word))
    }

    fn is_punct(&self, p: &str) -> bool {
        matches!(self, Token::Punct(q) if q == p)
    }
}

/// A statement ready to run, or a MySQL inspection command the session answers itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Statement {
    /// SQL to hand to SQLite.
    Sql(String),
    /// `SHOW TABLES`.
    ShowTables,
    /// `DESCRIBE t`, `DESC t`, `EXPLAIN t`, `SHOW COLUMNS FROM t`, `SHOW FIELDS FROM t`.
    Describe(String),
    /// `SHOW CREATE TABLE t`.
    ShowCreate(String),
    /// `USE db`: there is only one database; accepted without effect.
    Use,
}

/// Why a statement was refused before reaching SQLite.
pub(crate) type Refusal = String;

const COMPARISONS: &[&str] = &["=", "==", "!=", "<>", "<", ">", "<=", ">=", "<=>"];

/// Words that can never be a column reference in front of a comparison operator.
const NOT_COLUMNS: &[&str] = &[
    "null", "true", "false", "select", "where", "and", "or", "not", "on", "set", "when", "then",
    "else", "end", "case", "from", "by", "having", "is", "in", "like", "between", "exists",
];

fn lex(sql: &str) -> Result<Vec<Token>, Refusal> {
    let chars: Vec<char> = sql.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let n = chars.len();
    let is_ident_char = |c: char| c.is_alphanumeric() || c == '_' || c == '$' || (c as u32) > 127;
    while i < n {
        let c = chars[i];
        if c.is_whitespace() {
            let start = i;
            while i < n && chars[i].is_whitespace() {
                i += 1;
            }
            tokens.push(Token::Space(chars[start..i].iter().collect()));
        } else if c == '#'
            || (c == '-'
                && chars.get(i + 1) == Some(&'-')
                && chars
                    .get(i + 2)
                    .is_none_or(|c| c.is_whitespace() || c.is_control()))
        {
            // MySQL: `-- ` needs a space after it (`5--3` is 5 - -3); `#` always comments.
            while i < n && chars[i] != '\n' {
                i += 1;
            }
            tokens.push(Token::Space(" ".into()));
        } else if c == '/' && chars.get(i + 1) == Some(&'*') {
            let mut j = i + 2;
            while j + 1 < n && !(chars[j] == '*' && chars[j + 1] == '/') {
                j += 1;
            }
            if j + 1 >= n {
                return Err("a `/*` comment is never closed".into());
            }
            i = j + 2;
            tokens.push(Token::Space(" ".into()));
        } else if c == '\'' || c == '"' {
            let (text, next) = lex_string(&chars, i)?;
            i = next;
            tokens.push(if c == '\'' {
                Token::Str(text)
            } else {
                Token::DoubleQuoted(text)
            });
        } else if c == '`' {
            let mut text = String::new();
            let mut j = i + 1;
            loop {
                match chars.get(j) {
                    None => return Err("a backticked identifier is never closed".into()),
                    Some('`') if chars.get(j + 1) == Some(&'`') => {
                        text.push('`');
                        j += 2;
                    }
                    Some('`') => break,
                    Some(&ch) => {
                        text.push(ch);
                        j += 1;
                    }
                }
            }
            i = j + 1;
            tokens.push(Token::Ident(text));
        } else if c == '[' {
            // SQL Server style `[name]`; SQLite accepts it, so we do too.
            let Some(len) = chars[i + 1..].iter().position(|&ch| ch == ']') else {
                return Err("a `[` identifier is never closed".into());
            };
            tokens.push(Token::Ident(chars[i + 1..i + 1 + len].iter().collect()));
            i += len + 2;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let start = i;
            while i < n && is_ident_char(chars[i]) {
                i += 1;
            }
            // A decimal point and fraction, and an exponent sign.
            if i < n && chars[i] == '.' {
                i += 1;
                while i < n && is_ident_char(chars[i]) {
                    i += 1;
                }
            }
            if i < n
                && (chars[i] == '+' || chars[i] == '-')
                && matches!(chars[i - 1], 'e' | 'E')
                && chars.get(i + 1).is_some_and(char::is_ascii_digit)
                && is_number(&chars[start..i - 1].iter().collect::<String>())
            {
                i += 1;
                while i < n && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let text: String = chars[start..i].iter().collect();
            if is_number(&text) {
                tokens.push(Token::Number(text));
            } else if text.contains('.') {
                // `1st.col` style: split at the first dot and lex the parts again.
                let dot = text.find('.').unwrap_or(text.len());
                let (head, tail) = text.split_at(dot);
                push_word_or_number(&mut tokens, head);
                tokens.push(Token::Punct(".".into()));
                if tail.len() > 1 {
                    push_word_or_number(&mut tokens, &tail[1..]);
                }
            } else {
                // MySQL allows unquoted identifiers that start with a digit (`2nd_leg`).
                tokens.push(Token::Ident(text));
            }
        } else if is_ident_char(c) {
            let start = i;
            while i < n && is_ident_char(chars[i]) {
                i += 1;
            }
            tokens.push(Token::Word(chars[start..i].iter().collect()));
        } else if c == ';' {
            tokens.push(Token::Semicolon);
            i += 1;
        } else {
            let rest: String = chars[i..n.min(i + 3)].iter().collect();
            let op = [
                "<=>", "<=", ">=", "<>", "!=", "==", "||", "&&", "<<", ">>", ":=",
            ]
            .into_iter()
            .find(|op| rest.starts_with(op))
            .map(str::to_string)
            .unwrap_or_else(|| c.to_string());
            i += op.chars().count();
            tokens.push(Token::Punct(op));
        }
    }
    Ok(tokens)
}

fn push_word_or_number(tokens: &mut Vec<Token>, text: &str) {
    if is_number(text) {
        tokens.push(Token::Number(text.into()));
    } else if text.starts_with(|c: char| c.is_ascii_digit()) {
        tokens.push(Token::Ident(text.into()));
    } else {
        tokens.push(Token::Word(text.into()));
    }
}

/// A decimal or hexadecimal numeric literal.
fn is_number(text: &str) -> bool {
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        return !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit());
    }
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let mut parts = mantissa.splitn(2, '.');
    let int = parts.next().unwrap_or("");
    let frac = parts.next();
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    let mantissa_ok = digits(int)
        && frac.is_none_or(digits)
        && (!int.is_empty() || frac.is_some_and(|f| !f.is_empty()));
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exponent_ok
}

/// Reads a quoted string starting at `start` with MySQL's rules: a doubled quote is one quote,
/// and a backslash escapes the next character (`\n`, `\t`, `\0`, ...; `\%` and `\_` stay
/// two characters, for LIKE patterns). Returns the text and the index after the closing quote.
fn lex_string(chars: &[char], start: usize) -> Result<(String, usize), Refusal> {
    let quote = chars[start];
    let mut text = String::new();
    let mut i = start + 1;
    loop {
        let Some(&c) = chars.get(i) else {
            return Err(format!("a string starting with {quote} is never closed"));
        };
        if c == quote {
            if chars.get(i + 1) == Some(&quote) {
                text.push(quote);
                i += 2;
                continue;
            }
            return Ok((text, i + 1));
        }
        if c == '\\' {
            let Some(&next) = chars.get(i + 1) else {
                return Err(format!("a string starting with {quote} is never closed"));
            };
            match next {
                '0' => text.push('\0'),
                'b' => text.push('\u{8}'),
                'n' => text.push('\n'),
                'r' => text.push('\r'),
                't' => text.push('\t'),
                'Z' => text.push('\u{1a}'),
                '%' | '_' => {
                    text.push('\\');
                    text.push(next);
                }
                other => text.push(other),
            }
            i += 2;
            continue;
        }
        text.push(c);
        i += 1;
    }
}

/// `text` as an SQLite string literal.
pub(crate) fn sqlite_string(text: &str) -> String {
    if text.contains('\0') {
        // A NUL cannot appear inside SQL text; build the value with char(0).
        let parts: Vec<String> = text.split('\0').map(sqlite_string).collect();
        return format!("({})", parts.join(" || char(0) || "));
    }
    format!("'{}'", text.replace('\'', "''"))
}

/// `name` as an SQLite identifier (backticks, which never fall back to a string).
pub(crate) fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// Translate one MySQL statement into SQLite. `known` holds the lower-cased names of the
/// tables and columns in the database: a double-quoted token naming one of them is an
/// identifier, any other double-quoted token is a string (MySQL's reading).
pub(crate) fn translate(sql: &str, known: &BTreeSet<String>) -> Result<Statement, Refusal> {
    let mut tokens = lex(sql)?;
    // One statement: everything after the first `;` must be empty.
    if let Some(at) = tokens.iter().position(|t| *t == Token::Semicolon) {
        let rest_empty = tokens[at..]
            .iter()
            .all(|t| t.is_space() || *t == Token::Semicolon);
        if !rest_empty {
            return Err(
                "only one SQL statement can run per call; send the statements one at a time".into(),
            );
        }
        tokens.truncate(at);
    }
    // Resolve double-quoted tokens.
    for token in &mut tokens {
        if let Token::DoubleQuoted(text) = token {
            *token = if known.contains(&text.to_lowercase()) {
                Token::Ident(std::mem::take(text))
            } else {
                Token::Str(std::mem::take(text))
            };
        }
    }
    let significant: Vec<usize> = (0..tokens.len())
        .filter(|&i| !tokens[i].is_space())
        .collect();
    if significant.is_empty() {
        return Err("the query is empty".into());
    }
    if let Some(statement) = inspection(&tokens, &significant)? {
        return Ok(statement);
    }
    if tokens[significant[0]].is_word("vacuum") {
        return Err("VACUUM is not allowed here".into());
    }
    numeric_comparisons(&mut tokens, &significant);
    Ok(Statement::Sql(render(&tokens)))
}

/// `SHOW ...`, `DESCRIBE t` and friends.
fn inspection(tokens: &[Token], sig: &[usize]) -> Result<Option<Statement>, Refusal> {
    let word = |k: usize| sig.get(k).map(|&i| &tokens[i]);
    let name_at = |k: usize| -> Option<String> {
        match word(k)? {
            Token::Word(w) | Token::Ident(w) | Token::Str(w) => Some(w.clone()),
            _ => None,
        }
    };
    let first = &tokens[sig[0]];
    if first.is_word("use") {
        return Ok(Some(Statement::Use));
    }
    if first.is_word("describe") || first.is_word("desc") || first.is_word("explain") {
        if sig.len() == 2
            && let Some(name) = name_at(1)
        {
            return Ok(Some(Statement::Describe(name)));
        }
        if first.is_word("explain") {
            return Ok(None);
        }
        return Err("expected `DESCRIBE <table>`".into());
    }
    if !first.is_word("show") {
        return Ok(None);
    }
    let second = word(1);
    if second.is_some_and(|t| t.is_word("tables"))
        || (second.is_some_and(|t| t.is_word("full"))
            && word(2).is_some_and(|t| t.is_word("tables")))
    {
        return Ok(Some(Statement::ShowTables));
    }
    if second.is_some_and(|t| t.is_word("columns") || t.is_word("fields"))
        && word(2).is_some_and(|t| t.is_word("from") || t.is_word("in"))
        && let Some(name) = name_at(3)
    {
        return Ok(Some(Statement::Describe(name)));
    }
    if second.is_some_and(|t| t.is_word("create"))
        && word(2).is_some_and(|t| t.is_word("table"))
        && let Some(name) = name_at(3)
    {
        return Ok(Some(Statement::ShowCreate(name)));
    }
    if second.is_some_and(|t| t.is_word("databases")) {
        return Err("there is one database; use SHOW TABLES to list its tables".into());
    }
    Err("supported SHOW commands: SHOW TABLES, SHOW COLUMNS FROM <table>, SHOW CREATE TABLE <table>".into())
}

/// The token range `[start, end]` (significant positions) of a column reference ending at
/// significant position `end`, if the tokens there form one (`col`, `` `a b` ``, `t.col`).
fn column_ref_ending(tokens: &[Token], sig: &[usize], end: usize) -> Option<usize> {
    let is_name = |t: &Token| match t {
        Token::Ident(_) => true,
        Token::Word(w) => !NOT_COLUMNS.contains(&w.to_lowercase().as_str()),
        _ => false,
    };
    if !is_name(&tokens[sig[end]]) {
        return None;
    }
    let mut start = end;
    while start >= 2 && tokens[sig[start - 1]].is_punct(".") && is_name(&tokens[sig[start - 2]]) {
        start -= 2;
    }
    // A name right after another name or a `.` we did not take is part of something else.
    if start >= 1 && tokens[sig[start - 1]].is_punct(".") {
        return None;
    }
    // `f(x) = 1` ends with `)`, not a name, so function calls never get here; a name directly
    // followed by `(` is a function, which the caller rules out by looking at `end + 1`.
    Some(start)
}

/// The significant positions `[start, end]` of a numeric literal, with an optional sign,
/// starting at significant position `at`.
fn number_at(tokens: &[Token], sig: &[usize], at: usize) -> Option<usize> {
    match tokens.get(*sig.get(at)?)? {
        Token::Number(_) => Some(at),
        Token::Punct(p) if p == "-" || p == "+" => {
            matches!(tokens.get(*sig.get(at + 1)?)?, Token::Number(_)).then_some(at + 1)
        }
        _ => None,
    }
}

/// Wrap columns compared with numeric literals in `mysql_num(...)`, so `Goal < 17` compares
/// numbers as MySQL does instead of strings. Assignments in `UPDATE ... SET` are left alone.
fn numeric_comparisons(tokens: &mut [Token], sig: &[usize]) {
    // Where each significant token sits: its parenthesis depth, and whether it is inside the
    // assignment list of an `UPDATE ... SET` at that depth.
    let mut depth = 0usize;
    let mut set_depth: Option<usize> = None;
    let mut assignment = vec![false; sig.len()];
    for (k, &i) in sig.iter().enumerate() {
        let t = &tokens[i];
        if t.is_punct("(") {
            depth += 1;
        } else if t.is_punct(")") {
            depth = depth.saturating_sub(1);
            if set_depth.is_some_and(|d| d > depth) {
                set_depth = None;
            }
        } else if t.is_word("set") {
            set_depth = Some(depth);
        } else if set_depth == Some(depth)
            && (t.is_word("where") || t.is_word("order") || t.is_word("limit") || t.is_word("from"))
        {
            set_depth = None;
        }
        assignment[k] = set_depth == Some(depth);
    }
    let mut wrap: Vec<(usize, usize)> = Vec::new();
    for (k, &i) in sig.iter().enumerate() {
        let Token::Punct(op) = &tokens[i] else {
            // `col [NOT] IN (numbers)` and `col [NOT] BETWEEN n AND m`.
            if tokens[i].is_word("in") || tokens[i].is_word("between") {
                let col_end = if k >= 1 && tokens[sig[k - 1]].is_word("not") {
                    k.checked_sub(2)
                } else {
                    k.checked_sub(1)
                };
                let Some(col_end) = col_end else { continue };
                let Some(col_start) = column_ref_ending(tokens, sig, col_end) else {
                    continue;
                };
                let numeric = if tokens[i].is_word("in") {
                    in_list_is_numeric(tokens, sig, k + 1)
                } else {
                    number_at(tokens, sig, k + 1).is_some_and(|e| {
                        sig.get(e + 1).is_some_and(|&a| tokens[a].is_word("and"))
                            && number_at(tokens, sig, e + 2).is_some()
                    })
                };
                if numeric {
                    wrap.push((col_start, col_end));
                }
            }
            continue;
        };
        if !COMPARISONS.contains(&op.as_str()) || assignment[k] || k == 0 {
            continue;
        }
        // Column on the left, number on the right.
        if number_at(tokens, sig, k + 1).is_some()
            && let Some(start) = column_ref_ending(tokens, sig, k - 1)
        {
            wrap.push((start, k - 1));
            continue;
        }
        // Number on the left, column on the right.
        let left_number = matches!(tokens[sig[k - 1]], Token::Number(_));
        if left_number && k + 1 < sig.len() {
            let mut end = k + 1;
            while end + 2 < sig.len()
                && tokens[sig[end + 1]].is_punct(".")
                && matches!(tokens[sig[end + 2]], Token::Word(_) | Token::Ident(_))
            {
                end += 2;
            }
            let followed_by_call = sig.get(end + 1).is_some_and(|&j| tokens[j].is_punct("("));
            if !followed_by_call && column_ref_ending(tokens, sig, end) == Some(k + 1) {
                wrap.push((k + 1, end));
            }
        }
    }
    for (start, end) in wrap {
        let first = sig[start];
        let last = sig[end];
        if let Some(text) = token_text(&tokens[first]) {
            tokens[first] = Token::Space(format!("mysql_num({text}"));
        }
        if first == last {
            if let Token::Space(text) = &mut tokens[first] {
                text.push(')');
            }
        } else if let Some(text) = token_text(&tokens[last]) {
            tokens[last] = Token::Space(format!("{text})"));
        }
    }
}

fn in_list_is_numeric(tokens: &[Token], sig: &[usize], open: usize) -> bool {
    if !sig.get(open).is_some_and(|&i| tokens[i].is_punct("(")) {
        return false;
    }
    let mut k = open + 1;
    loop {
        let Some(end) = number_at(tokens, sig, k) else {
            return false;
        };
        match sig.get(end + 1).map(|&i| &tokens[i]) {
            Some(t) if t.is_punct(",") => k = end + 2,
            Some(t) if t.is_punct(")") => return true,
            _ => return false,
        }
    }
}

/// A token as SQLite text; `None` for tokens rendered elsewhere.
fn token_text(token: &Token) -> Option<String> {
    Some(match token {
        Token::Space(s) => s.clone(),
        Token::Word(w) if w.eq_ignore_ascii_case("rlike") => "REGEXP".into(),
        Token::Word(w) => w.clone(),
        Token::Ident(name) => quote_ident(name),
        Token::DoubleQuoted(text) | Token::Str(text) => sqlite_string(text),
        Token::Number(n) => n.clone(),
        Token::Punct(p) => match p.as_str() {
            "<=>" => " IS ".into(),
            "&&" => " AND ".into(),
            other => other.into(),
        },
        Token::Semicolon => return None,
    })
}

fn render(tokens: &[Token]) -> String {
    tokens.iter().filter_map(token_text).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> BTreeSet<String> {
        ["t", "goal", "name"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn sql(text: &str) -> String {
        match translate(text, &known()) {
            Ok(Statement::Sql(s)) => s,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn backslash_escapes_become_sqlite_literals() {
        assert_eq!(
            sql(r"SELECT * FROM t WHERE a = 'Don\'t' AND b = 'x''y'"),
            "SELECT * FROM t WHERE a = 'Don''t' AND b = 'x''y'"
        );
        assert_eq!(sql(r#"SELECT 'a\\b', 'c\nd'"#), "SELECT 'a\\b', 'c\nd'");
        assert_eq!(sql(r"SELECT 'a\%b'"), r"SELECT 'a\%b'");
    }

    #[test]
    fn double_quotes_are_strings_unless_they_name_something() {
        assert_eq!(
            sql(r#"SELECT "Goal" FROM "t" WHERE name = "Bob\"s""#),
            r#"SELECT `Goal` FROM `t` WHERE name = 'Bob"s'"#
        );
    }

    #[test]
    fn digit_identifiers_and_backticks() {
        assert_eq!(
            sql("SELECT 2nd_leg FROM `my t`"),
            "SELECT `2nd_leg` FROM `my t`"
        );
        assert_eq!(
            sql("SELECT 1e5, 0x1F, 3.5, .5"),
            "SELECT 1e5, 0x1F, 3.5, .5"
        );
    }

    #[test]
    fn numeric_comparisons_are_wrapped() {
        assert_eq!(
            sql("SELECT a FROM t WHERE Goal < 17 AND `x y` >= -2.5"),
            "SELECT a FROM t WHERE mysql_num(Goal) < 17 AND mysql_num(`x y`) >= -2.5"
        );
        assert_eq!(
            sql("SELECT 1 FROM t WHERE 5 = t.a"),
            "SELECT 1 FROM t WHERE 5 = mysql_num(t.a)"
        );
        assert_eq!(
            sql("SELECT 1 FROM t WHERE a NOT IN (1, 2) OR b BETWEEN 1 AND 3"),
            "SELECT 1 FROM t WHERE mysql_num(a) NOT IN (1, 2) OR mysql_num(b) BETWEEN 1 AND 3"
        );
        assert_eq!(
            sql("SELECT 1 FROM t WHERE a = '5'"),
            "SELECT 1 FROM t WHERE a = '5'"
        );
        assert_eq!(
            sql("SELECT 1 FROM t WHERE count(a) > 5"),
            "SELECT 1 FROM t WHERE count(a) > 5"
        );
    }

    #[test]
    fn assignments_are_left_alone() {
        assert_eq!(
            sql("UPDATE t SET a = 5, b = (SELECT max(c) FROM t WHERE c > 1) WHERE d = 3"),
            "UPDATE t SET a = 5, b = (SELECT max(c) FROM t WHERE mysql_num(c) > 1) WHERE mysql_num(d) = 3"
        );
    }

    #[test]
    fn one_statement_only() {
        assert_eq!(sql("SELECT 1;  ;"), "SELECT 1");
        assert!(translate("SELECT 1; DROP TABLE t", &known()).is_err());
        assert!(translate("   ", &known()).is_err());
        assert!(translate("SELECT 'open", &known()).is_err());
    }

    #[test]
    fn comments_and_operators() {
        assert_eq!(sql("SELECT 1 # note\n"), "SELECT 1  \n");
        assert_eq!(sql("SELECT 1 -- note\n"), "SELECT 1  \n");
        assert_eq!(sql("SELECT 5--3"), "SELECT 5--3");
        assert_eq!(sql("SELECT a <=> b && c"), "SELECT a  IS  b  AND  c");
        assert_eq!(sql("SELECT a RLIKE 'x'"), "SELECT a REGEXP 'x'");
    }

    #[test]
    fn inspection_commands() {
        let k = known();
        assert_eq!(translate("SHOW TABLES;", &k), Ok(Statement::ShowTables));
        assert_eq!(
            translate("describe `t`", &k),
            Ok(Statement::Describe("t".into()))
        );
        assert_eq!(
            translate("SHOW COLUMNS FROM t", &k),
            Ok(Statement::Describe("t".into()))
        );
        assert_eq!(
            translate("show create table \"t\"", &k),
            Ok(Statement::ShowCreate("t".into()))
        );
    }
}
