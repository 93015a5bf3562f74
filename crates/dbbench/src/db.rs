//! One episode's SQLite database: MySQL-like collation and functions, safety limits, statement
//! execution with rendered results, and AgentBench's table hash.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use md5::{Digest, Md5};
use regex::{Regex, RegexBuilder};
use rusqlite::functions::FunctionFlags;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OpenFlags};

use super::data::DbTable;
use super::sql::{self, Statement, quote_ident};

/// The collation the task's TEXT columns use: case- and accent-insensitive, like MySQL's
/// default `utf8mb4_0900_ai_ci`.
pub const MYSQL_COLLATION: &str = "mysql_ci";

/// Safety and output limits of an episode's database.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DbLimits {
    /// Wall-clock time one statement may run.
    pub statement_time: Duration,
    /// Virtual-machine instructions one statement may run (deterministic, unlike the clock;
    /// SQLite runs about 50 million a second, so the default stops runaways in about a second
    /// while a three-way join of 100-row tables still fits easily).
    pub statement_ops: u64,
    /// Result rows read before the rest is dropped.
    pub max_rows: usize,
    /// Characters of rendered result kept (the observation is cut further by the session).
    pub max_result_chars: usize,
    /// Largest string or blob a statement may build, in bytes.
    pub max_value_bytes: i32,
    /// Largest SQL text, in bytes.
    pub max_sql_bytes: i32,
    /// Largest database, in 4 KiB pages (the temp schema gets the same cap, although the
    /// authorizer refuses creating anything in it).
    pub max_pages: u32,
    /// SQLite's hard heap limit, in bytes: a statement that needs more memory (a huge sort, a
    /// materialised subquery) fails with an error observation instead of growing the process.
    /// SQLite has no per-connection heap limit, so this one is shared by every database of
    /// the process, and it can only be lowered: the lowest any database asked for holds.
    pub process_heap_bytes: i64,
}

impl Default for DbLimits {
    fn default() -> Self {
        DbLimits {
            statement_time: Duration::from_secs(2),
            statement_ops: 50_000_000,
            max_rows: 10_000,
            max_result_chars: 8_000,
            max_value_bytes: 1 << 20,
            max_sql_bytes: 100_000,
            max_pages: 8_192,
            process_heap_bytes: 1 << 30,
        }
    }
}

/// What a statement produced, as the policy sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlOutcome {
    /// The rendered rows, the affected-row count, or the error.
    pub text: String,
    /// Whether the statement failed.
    pub error: bool,
}

impl SqlOutcome {
    fn ok(text: impl Into<String>) -> Self {
        SqlOutcome {
            text: text.into(),
            error: false,
        }
    }

    fn error(text: impl Into<String>) -> Self {
        SqlOutcome {
            text: format!("Error: {}", text.into()),
            error: true,
        }
    }
}

/// The running statement's budget, shared with the progress handler and the authorizer.
#[derive(Debug, Default)]
struct Budget {
    started: Mutex<Option<Instant>>,
    ops: AtomicU64,
    stopped_by_time: AtomicBool,
    stopped_by_ops: AtomicBool,
    /// Why the authorizer refused the statement being prepared, if it did.
    refused: Mutex<Option<String>>,
}

/// An in-memory SQLite database set up for one DBBench episode.
pub struct Database {
    conn: Connection,
    budget: Arc<Budget>,
    limits: DbLimits,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// How often (in VM instructions) the progress handler runs.
const PROGRESS_PERIOD: u64 = 10_000;

/// MySQL's default `group_concat_max_len`: AgentBench's hash query concatenates row hashes with
/// `GROUP_CONCAT`, which MySQL cuts at this many bytes.
pub const GROUP_CONCAT_MAX_LEN: usize = 1024;

impl Database {
    /// A fresh database holding `tables`, every column TEXT with the MySQL-like collation.
    pub fn create(tables: &[DbTable], limits: DbLimits) -> rusqlite::Result<Database> {
        let conn = Connection::open_in_memory_with_flags(
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        // Settings first: the authorizer installed below refuses pragmas.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        conn.pragma_update(None, "max_page_count", limits.max_pages)?;
        conn.pragma_update(Some("temp"), "max_page_count", limits.max_pages)?;
        // Sorts, DISTINCT and materialised subqueries keep their temporary b-trees in memory
        // (temp_store above) with no page cap of their own; only the heap limit bounds them.
        conn.pragma_update(None, "hard_heap_limit", limits.process_heap_bytes)?;
        conn.pragma_update(None, "trusted_schema", "OFF")?;
        // Loading extensions is off by default (the C API is never enabled), and the
        // authorizer refuses the `load_extension` SQL function as well.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_ATTACH_CREATE,
            false,
        )?;
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_ATTACH_WRITE,
            false,
        )?;
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_DQS_DML, false)?;
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_DQS_DDL, false)?;
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
        conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)?;
        conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, limits.max_value_bytes)?;
        conn.set_limit(Limit::SQLITE_LIMIT_SQL_LENGTH, limits.max_sql_bytes)?;
        conn.set_limit(Limit::SQLITE_LIMIT_EXPR_DEPTH, 200)?;
        conn.set_limit(Limit::SQLITE_LIMIT_COMPOUND_SELECT, 50)?;
        conn.set_limit(Limit::SQLITE_LIMIT_TRIGGER_DEPTH, 10)?;
        conn.set_limit(Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 1_000)?;
        conn.set_limit(Limit::SQLITE_LIMIT_WORKER_THREADS, 0)?;
        register_functions(&conn)?;

        for table in tables {
            let columns: Vec<String> = table
                .columns
                .iter()
                .map(|c| format!("{} TEXT COLLATE {MYSQL_COLLATION}", quote_ident(c)))
                .collect();
            conn.execute(
                &format!(
                    "CREATE TABLE {} ({})",
                    quote_ident(&table.name),
                    columns.join(", ")
                ),
                [],
            )?;
            if table.rows.is_empty() {
                continue;
            }
            let placeholders = vec!["?"; table.columns.len()].join(", ");
            let tx = conn.unchecked_transaction()?;
            {
                let mut insert = tx.prepare(&format!(
                    "INSERT INTO {} VALUES ({placeholders})",
                    quote_ident(&table.name)
                ))?;
                for row in &table.rows {
                    insert.execute(rusqlite::params_from_iter(row.iter()))?;
                }
            }
            tx.commit()?;
        }

        let budget = Arc::new(Budget::default());
        let authorizer_budget = Arc::clone(&budget);
        conn.authorizer(Some(move |context: AuthContext<'_>| {
            match refusal(&context) {
                Some(reason) => {
                    *authorizer_budget
                        .refused
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(reason);
                    Authorization::Deny
                }
                None => Authorization::Allow,
            }
        }));
        let handler_budget = Arc::clone(&budget);
        conn.progress_handler(
            PROGRESS_PERIOD as i32,
            Some(move || handler_budget.should_stop(limits)),
        );
        Ok(Database {
            conn,
            budget,
            limits,
        })
    }

    /// Lower-cased names of every table and column (to tell identifiers from strings).
    pub fn known_names(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for table in self.table_names() {
            names.insert(table.to_lowercase());
            for column in self.columns(&table).unwrap_or_default() {
                names.insert(column.to_lowercase());
            }
        }
        names
    }

    fn table_names(&self) -> Vec<String> {
        self.budget.start();
        let Ok(mut stmt) = self
            .conn
            .prepare(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND substr(name, 1, 7) <> 'sqlite_' ORDER BY rowid",
            )
        else {
            return Vec::new();
        };
        stmt.query_map([], |row| row.get::<_, String>(0))
            .map(|rows| rows.filter_map(|r| r.ok()).collect())
            .unwrap_or_default()
    }

    /// The column names of `table` (resolved case-insensitively), or `None` if there is none.
    fn columns(&self, table: &str) -> Option<Vec<String>> {
        self.budget.start();
        let mut stmt = self
            .conn
            .prepare(&format!("PRAGMA table_info({})", quote_ident(table)))
            .ok()?;
        let columns: Vec<String> = stmt
            .query_map([], |row| row.get::<_, String>(1))
            .ok()?
            .filter_map(|r| r.ok())
            .collect();
        (!columns.is_empty()).then_some(columns)
    }

    /// Run one MySQL-dialect statement; errors (bad SQL, refused actions, limits) are part of
    /// the outcome, never an `Err`.
    pub fn execute(&self, query: &str) -> SqlOutcome {
        if query.len() > self.limits.max_sql_bytes as usize {
            return SqlOutcome::error(format!(
                "the query is {} bytes long; the limit is {} bytes",
                query.len(),
                self.limits.max_sql_bytes
            ));
        }
        let statement = match sql::translate(query, &self.known_names()) {
            Ok(statement) => statement,
            Err(reason) => return SqlOutcome::error(reason),
        };
        match statement {
            Statement::Sql(text) => self.run(&text),
            Statement::Use => SqlOutcome::ok("Database changed"),
            Statement::ShowTables => {
                let rows: Vec<Vec<Value>> = self
                    .table_names()
                    .into_iter()
                    .map(|t| vec![Value::Text(t)])
                    .collect();
                SqlOutcome::ok(render_rows(&rows, false))
            }
            Statement::Describe(table) => match self.columns(&table) {
                Some(columns) => {
                    let rows: Vec<Vec<Value>> = columns
                        .into_iter()
                        .map(|c| {
                            vec![
                                Value::Text(c),
                                Value::Text("text".into()),
                                Value::Text("YES".into()),
                                Value::Text(String::new()),
                                Value::Null,
                                Value::Text(String::new()),
                            ]
                        })
                        .collect();
                    SqlOutcome::ok(render_rows(&rows, false))
                }
                None => SqlOutcome::error(format!("table `{table}` doesn't exist")),
            },
            Statement::ShowCreate(table) => {
                self.budget.start();
                let found: Option<String> = self
                    .conn
                    .query_row(
                        "SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND lower(name) = lower(?1)",
                        [&table],
                        |row| Ok(format!("{}\n{}", row.get::<_, String>(0)?, row.get::<_, String>(1)?)),
                    )
                    .ok();
                match found {
                    Some(text) => SqlOutcome::ok(text),
                    None => SqlOutcome::error(format!("table `{table}` doesn't exist")),
                }
            }
        }
    }

    /// Run a MySQL-dialect query and return its rows as values (for ground truth).
    pub fn query_values(&self, query: &str) -> Result<Vec<Vec<Value>>, String> {
        let Statement::Sql(text) = sql::translate(query, &self.known_names())? else {
            return Err("expected a SELECT statement".into());
        };
        self.budget.start();
        let run = || -> rusqlite::Result<Vec<Vec<Value>>> {
            let mut stmt = self.conn.prepare(&text)?;
            let width = stmt.column_count();
            let mut rows = stmt.query([])?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let mut values = Vec::with_capacity(width);
                for i in 0..width {
                    values.push(row.get_ref(i)?.into());
                }
                out.push(values);
                if out.len() > self.limits.max_rows {
                    break;
                }
            }
            Ok(out)
        };
        run().map_err(|e| describe_error(&e))
    }

    fn run(&self, text: &str) -> SqlOutcome {
        self.budget.start();
        let result = self.run_inner(text);
        match result {
            Ok(outcome) => outcome,
            Err(e) => {
                if self.budget.stopped_by_time.load(AtomicOrdering::Relaxed) {
                    SqlOutcome::error(format!(
                        "the statement was stopped after running for more than {:.1} s",
                        self.limits.statement_time.as_secs_f64()
                    ))
                } else if self.budget.stopped_by_ops.load(AtomicOrdering::Relaxed) {
                    SqlOutcome::error(format!(
                        "the statement was stopped after {} million steps; it does too much work",
                        self.limits.statement_ops / 1_000_000
                    ))
                } else if let Some(reason) = self.budget.refusal() {
                    SqlOutcome::error(format!("not authorized: {reason}"))
                } else if is_out_of_memory(&e) {
                    SqlOutcome::error(format!(
                        "the statement was stopped: it needs more memory than the {} MiB allowed",
                        self.limits.process_heap_bytes >> 20
                    ))
                } else {
                    SqlOutcome::error(describe_error(&e))
                }
            }
        }
    }

    fn run_inner(&self, text: &str) -> rusqlite::Result<SqlOutcome> {
        let mut stmt = self.conn.prepare(text)?;
        if stmt.column_count() == 0 {
            // Rows this statement changed: SQLite's per-statement count keeps the last change's
            // value across DDL (a CREATE TABLE after an INSERT would report that INSERT's rows),
            // the running total does not move for it.
            let before = self.conn.total_changes();
            stmt.execute([])?;
            let changed = self.conn.total_changes() - before;
            let plural = if changed == 1 { "" } else { "s" };
            return Ok(SqlOutcome::ok(format!(
                "Query OK, {changed} row{plural} affected"
            )));
        }
        let width = stmt.column_count();
        let mut rows_out: Vec<Vec<Value>> = Vec::new();
        let mut chars = 0usize;
        let mut more = false;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            if rows_out.len() >= self.limits.max_rows || chars >= self.limits.max_result_chars {
                more = true;
                break;
            }
            let mut values = Vec::with_capacity(width);
            for i in 0..width {
                let value: Value = row.get_ref(i)?.into();
                chars += match &value {
                    Value::Text(t) => t.len() + 4,
                    Value::Blob(b) => b.len() + 4,
                    _ => 8,
                };
                values.push(value);
            }
            rows_out.push(values);
        }
        Ok(SqlOutcome::ok(render_rows(&rows_out, more)))
    }

    /// AgentBench's hash of the tables (see [`Self::table_hash`]): the per-table hashes sorted and
    /// joined with `_`. An `Err` says which table or column cannot be read.
    pub fn tables_hash(&self, tables: &[DbTable]) -> Result<String, String> {
        let mut hashes = Vec::new();
        for table in tables {
            hashes.push(self.table_hash(table)?);
        }
        hashes.sort();
        Ok(hashes.join("_"))
    }

    /// One table's hash, as AgentBench computes it on MySQL:
    /// `md5(group_concat(substring(md5(concat_ws(',', cols...)), 1, 5) order by ...))`.
    pub fn table_hash(&self, table: &DbTable) -> Result<String, String> {
        self.budget.start();
        let columns: Vec<String> = table.columns.iter().map(|c| quote_ident(c)).collect();
        let query = format!(
            "SELECT {} FROM {}",
            columns.join(", "),
            quote_ident(&table.name)
        );
        let mut stmt = self
            .conn
            .prepare(&query)
            .map_err(|e| format!("the table cannot be read: {}", describe_error(&e)))?;
        let mut rows = stmt
            .query([])
            .map_err(|e| format!("the table cannot be read: {}", describe_error(&e)))?;
        let mut row_hashes: Vec<String> = Vec::new();
        while let Some(row) = rows
            .next()
            .map_err(|e| format!("the table cannot be read: {}", describe_error(&e)))?
        {
            let mut joined: Vec<u8> = Vec::new();
            let mut first = true;
            for i in 0..table.columns.len() {
                let value = row
                    .get_ref(i)
                    .map_err(|e| format!("the table cannot be read: {e}"))?;
                let bytes: Vec<u8> = match value {
                    ValueRef::Null => continue,
                    ValueRef::Integer(v) => v.to_string().into_bytes(),
                    ValueRef::Real(v) => python_float(v).into_bytes(),
                    ValueRef::Text(t) | ValueRef::Blob(t) => t.to_vec(),
                };
                if !first {
                    joined.push(b',');
                }
                first = false;
                joined.extend_from_slice(&bytes);
            }
            row_hashes.push(md5_hex(&joined)[..5].to_string());
        }
        if row_hashes.is_empty() {
            // MySQL: GROUP_CONCAT over no rows is NULL, and so is its MD5.
            return Ok("None".to_string());
        }
        row_hashes.sort();
        let mut concatenated = row_hashes.join(",");
        concatenated.truncate(GROUP_CONCAT_MAX_LEN);
        Ok(md5_hex(concatenated.as_bytes()))
    }
}

impl Budget {
    fn start(&self) {
        *self.started.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        self.ops.store(0, AtomicOrdering::Relaxed);
        self.stopped_by_time.store(false, AtomicOrdering::Relaxed);
        self.stopped_by_ops.store(false, AtomicOrdering::Relaxed);
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn refusal(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn should_stop(&self, limits: DbLimits) -> bool {
        let ops = self.ops.fetch_add(PROGRESS_PERIOD, AtomicOrdering::Relaxed) + PROGRESS_PERIOD;
        if ops > limits.statement_ops {
            self.stopped_by_ops.store(true, AtomicOrdering::Relaxed);
            return true;
        }
        let started = *self.started.lock().unwrap_or_else(|e| e.into_inner());
        if started.is_some_and(|s| s.elapsed() > limits.statement_time) {
            self.stopped_by_time.store(true, AtomicOrdering::Relaxed);
            return true;
        }
        false
    }
}

const TEMP_REFUSAL: &str =
    "temporary tables, views, triggers and indexes are disabled; create a regular one";

/// The authorizer: everything a query needs, nothing that reaches outside the database or
/// grows outside its page cap. Returns why an action is refused, `None` to allow it.
fn refusal(context: &AuthContext<'_>) -> Option<String> {
    // `CREATE TABLE temp.t` is reported as a plain CREATE TABLE in the temp database.
    let in_temp = context
        .database_name
        .is_some_and(|name| name.eq_ignore_ascii_case("temp"));
    match context.action {
        AuthAction::CreateTable { .. }
        | AuthAction::CreateView { .. }
        | AuthAction::CreateTrigger { .. }
        | AuthAction::CreateIndex { .. }
            if in_temp =>
        {
            Some(TEMP_REFUSAL.into())
        }
        AuthAction::Attach { .. } | AuthAction::Detach { .. } => {
            Some("ATTACH and DETACH are disabled".into())
        }
        AuthAction::CreateVtable { .. } | AuthAction::DropVtable { .. } => {
            Some("virtual tables are disabled".into())
        }
        // The temp schema is a second database beside the capped main one; a TEMP table
        // filled statement by statement would grow memory past the page cap.
        AuthAction::CreateTempTable { .. }
        | AuthAction::CreateTempView { .. }
        | AuthAction::CreateTempTrigger { .. }
        | AuthAction::CreateTempIndex { .. } => Some(TEMP_REFUSAL.into()),
        AuthAction::Pragma { pragma_name, .. } => {
            const READ_ONLY: &[&str] = &["table_info", "table_xinfo", "index_list", "index_info"];
            (!READ_ONLY.contains(&pragma_name.to_ascii_lowercase().as_str())).then(|| {
                format!(
                    "PRAGMA {pragma_name} is disabled; only {} are allowed",
                    READ_ONLY.join(", ")
                )
            })
        }
        AuthAction::Function { function_name } => {
            const REFUSED: &[&str] = &["load_extension", "fts3_tokenizer", "readfile", "writefile"];
            REFUSED
                .contains(&function_name.to_ascii_lowercase().as_str())
                .then(|| format!("the function {function_name} is disabled"))
        }
        AuthAction::Unknown { .. } => Some("this statement is disabled".into()),
        _ => None,
    }
}

/// Whether SQLite failed for lack of memory (the hard heap limit).
fn is_out_of_memory(error: &rusqlite::Error) -> bool {
    matches!(
        error,
        rusqlite::Error::SqliteFailure(e, _) | rusqlite::Error::SqlInputError { error: e, .. }
            if e.code == rusqlite::ErrorCode::OutOfMemory
    )
}

/// An SQLite error as the policy sees it: the message only, never the translated SQL (which
/// would show our rewriting, e.g. `mysql_num(...)`).
fn describe_error(error: &rusqlite::Error) -> String {
    let (code, message) = match error {
        rusqlite::Error::SqliteFailure(e, Some(message)) => (e.code, message.clone()),
        rusqlite::Error::SqliteFailure(e, None) => (e.code, e.to_string()),
        rusqlite::Error::SqlInputError { error, msg, .. } => (error.code, msg.clone()),
        other => return other.to_string(),
    };
    if code == rusqlite::ErrorCode::AuthorizationForStatementDenied {
        format!("{message} (ATTACH, PRAGMA, extensions and file access are disabled)")
    } else {
        message
    }
}

/// Lower-case hex MD5.
pub fn md5_hex(bytes: &[u8]) -> String {
    let digest = Md5::digest(bytes);
    let mut out = String::with_capacity(32);
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Python's `repr` of a float (what AgentBench shows for MySQL doubles): `2011.0`, `0.5`,
/// `1e+16`.
pub fn python_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let abs = v.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        // Rust's `{:e}` is the shortest round-trip digits, like Python's repr.
        let s = format!("{v:e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exponent.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let s = format!("{v}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

/// Python's `repr` of a string.
fn python_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

fn render_value(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Integer(i) => i.to_string(),
        Value::Real(r) => python_float(*r),
        Value::Text(t) => python_str(t),
        Value::Blob(b) => format!("b{}", python_str(&String::from_utf8_lossy(b))),
    }
}

/// Rows as the MySQL connector's Python result prints them: `[('a', 1), ('b', 2)]`, which is
/// what AgentBench shows the model.
pub fn render_rows(rows: &[Vec<Value>], more: bool) -> String {
    let mut out = String::from("[");
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('(');
        for (j, value) in row.iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            out.push_str(&render_value(value));
        }
        if row.len() == 1 {
            out.push(',');
        }
        out.push(')');
    }
    out.push(']');
    if more {
        out.push_str(" [more rows not shown]");
    }
    out
}

/// Case- and accent-folded text for comparisons.
pub fn fold(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii() {
            out.push(c.to_ascii_lowercase());
            continue;
        }
        if ('\u{300}'..='\u{36f}').contains(&c) {
            // Combining accents (decomposed text) are ignored.
            continue;
        }
        for lower in c.to_lowercase() {
            match strip_accent(lower) {
                Some(base) => out.push_str(base),
                None => out.push(lower),
            }
        }
    }
    out
}

/// The base letters of the accented Latin letters MySQL's accent-insensitive collations
/// equate with them (lower case only: [`fold`] lower-cases first).
fn strip_accent(c: char) -> Option<&'static str> {
    Some(match c {
        'à' | 'á' | 'â' | 'ã' | 'ä' | 'å' | 'ā' | 'ă' | 'ą' | 'ǎ' => "a",
        'æ' => "ae",
        'ç' | 'ć' | 'ĉ' | 'ċ' | 'č' => "c",
        'ď' | 'đ' | 'ð' => "d",
        'è' | 'é' | 'ê' | 'ë' | 'ē' | 'ĕ' | 'ė' | 'ę' | 'ě' => "e",
        'ĝ' | 'ğ' | 'ġ' | 'ģ' => "g",
        'ĥ' | 'ħ' => "h",
        'ì' | 'í' | 'î' | 'ï' | 'ĩ' | 'ī' | 'ĭ' | 'į' | 'ı' | 'ǐ' => "i",
        'ĵ' => "j",
        'ķ' => "k",
        'ĺ' | 'ļ' | 'ľ' | 'ŀ' | 'ł' => "l",
        'ñ' | 'ń' | 'ņ' | 'ň' => "n",
        'ò' | 'ó' | 'ô' | 'õ' | 'ö' | 'ø' | 'ō' | 'ŏ' | 'ő' | 'ǒ' => "o",
        'œ' => "oe",
        'ŕ' | 'ŗ' | 'ř' => "r",
        'ś' | 'ŝ' | 'ş' | 'š' | 'ș' => "s",
        'ß' => "ss",
        'ţ' | 'ť' | 'ŧ' | 'ț' => "t",
        'ù' | 'ú' | 'û' | 'ü' | 'ũ' | 'ū' | 'ŭ' | 'ů' | 'ű' | 'ų' | 'ǔ' => "u",
        'ŵ' => "w",
        'ý' | 'ÿ' | 'ŷ' => "y",
        'ź' | 'ż' | 'ž' => "z",
        _ => return None,
    })
}

/// The collation of the task's columns.
pub fn mysql_compare(a: &str, b: &str) -> Ordering {
    fold(a).cmp(&fold(b))
}

/// MySQL's string-to-number conversion: the longest numeric prefix after leading spaces, 0 if
/// there is none (`'12abc'` is 12, `'abc'` is 0, `'1,234'` is 1).
pub fn mysql_number(text: &str) -> f64 {
    let t = text.trim_start();
    let bytes = t.as_bytes();
    let mut end = 0;
    if end < bytes.len() && (bytes[end] == b'+' || bytes[end] == b'-') {
        end += 1;
    }
    let digits_start = end;
    while end < bytes.len() && bytes[end].is_ascii_digit() {
        end += 1;
    }
    let mut mantissa_digits = end - digits_start;
    if end < bytes.len() && bytes[end] == b'.' {
        let frac_start = end + 1;
        let mut e = frac_start;
        while e < bytes.len() && bytes[e].is_ascii_digit() {
            e += 1;
        }
        mantissa_digits += e - frac_start;
        if mantissa_digits > 0 {
            end = e;
        }
    }
    if mantissa_digits == 0 {
        return 0.0;
    }
    if end < bytes.len() && (bytes[end] == b'e' || bytes[end] == b'E') {
        let mut e = end + 1;
        if e < bytes.len() && (bytes[e] == b'+' || bytes[e] == b'-') {
            e += 1;
        }
        let exp_start = e;
        while e < bytes.len() && bytes[e].is_ascii_digit() {
            e += 1;
        }
        if e > exp_start {
            end = e;
        }
    }
    t[..end].parse().unwrap_or(0.0)
}

/// One element of a LIKE pattern.
#[derive(Debug, Clone, Copy, PartialEq)]
enum LikePiece {
    Char(char),
    One,
    Any,
}

fn like_pieces(pattern: &str, escape: char) -> Vec<LikePiece> {
    let mut pieces = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c == escape {
            // An escape at the very end stands for itself, as in MySQL.
            let literal = chars.next().unwrap_or(escape);
            pieces.extend(fold(&literal.to_string()).chars().map(LikePiece::Char));
        } else if c == '%' {
            if pieces.last() != Some(&LikePiece::Any) {
                pieces.push(LikePiece::Any);
            }
        } else if c == '_' {
            pieces.push(LikePiece::One);
        } else {
            pieces.extend(fold(&c.to_string()).chars().map(LikePiece::Char));
        }
    }
    pieces
}

/// MySQL's LIKE: `%` and `_` wildcards, `\` as the default escape, case- and
/// accent-insensitive. Linear-time matching with backtracking to the last `%`.
pub fn mysql_like(pattern: &str, value: &str, escape: char) -> bool {
    let pieces = like_pieces(pattern, escape);
    let text: Vec<char> = fold(value).chars().collect();
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pieces.get(p) {
            Some(LikePiece::Any) => {
                star = Some((p, t));
                p += 1;
            }
            Some(LikePiece::One) => {
                p += 1;
                t += 1;
            }
            Some(LikePiece::Char(c)) if *c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pieces[p..].iter().all(|piece| *piece == LikePiece::Any)
}

fn value_text(value: ValueRef<'_>) -> Option<String> {
    match value {
        ValueRef::Null => None,
        ValueRef::Integer(i) => Some(i.to_string()),
        ValueRef::Real(r) => Some(python_float(r)),
        ValueRef::Text(t) | ValueRef::Blob(t) => Some(String::from_utf8_lossy(t).into_owned()),
    }
}

fn user_error(message: impl Into<String>) -> rusqlite::Error {
    rusqlite::Error::UserFunctionError(message.into().into())
}

/// MySQL functions and operators SQLite lacks, and MySQL's LIKE.
fn register_functions(conn: &Connection) -> rusqlite::Result<()> {
    let deterministic = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    conn.create_collation(MYSQL_COLLATION, mysql_compare)?;
    conn.create_scalar_function("mysql_num", 1, deterministic, |ctx| {
        Ok(match ctx.get_raw(0) {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(i) => Value::Integer(i),
            ValueRef::Real(r) => Value::Real(r),
            ValueRef::Text(t) | ValueRef::Blob(t) => {
                Value::Real(mysql_number(&String::from_utf8_lossy(t)))
            }
        })
    })?;
    for args in [2, 3] {
        conn.create_scalar_function("like", args, deterministic, move |ctx| {
            let (Some(pattern), Some(value)) =
                (value_text(ctx.get_raw(0)), value_text(ctx.get_raw(1)))
            else {
                return Ok(None);
            };
            let escape = if args == 3 {
                let escape = value_text(ctx.get_raw(2)).unwrap_or_default();
                let mut chars = escape.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), None) => c,
                    _ => return Err(user_error("ESCAPE expression must be a single character")),
                }
            } else {
                '\\'
            };
            if pattern.chars().count() > 1_000 {
                return Err(user_error("LIKE pattern too long"));
            }
            Ok(Some(mysql_like(&pattern, &value, escape)))
        })?;
    }
    let cache: Mutex<Option<(String, Regex)>> = Mutex::new(None);
    conn.create_scalar_function("regexp", 2, deterministic, move |ctx| {
        let (Some(pattern), Some(value)) = (value_text(ctx.get_raw(0)), value_text(ctx.get_raw(1)))
        else {
            return Ok(None);
        };
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.as_ref().is_none_or(|(p, _)| *p != pattern) {
            let regex = RegexBuilder::new(&pattern)
                .case_insensitive(true)
                .size_limit(1 << 20)
                .build()
                .map_err(|e| user_error(format!("invalid regular expression: {e}")))?;
            *cache = Some((pattern, regex));
        }
        Ok(Some(
            cache.as_ref().is_some_and(|(_, r)| r.is_match(&value)),
        ))
    })?;
    conn.create_scalar_function("md5", 1, deterministic, |ctx| {
        Ok(match ctx.get_raw(0) {
            ValueRef::Null => None,
            ValueRef::Text(t) | ValueRef::Blob(t) => Some(md5_hex(t)),
            other => value_text(other).map(|t| md5_hex(t.as_bytes())),
        })
    })?;
    conn.create_scalar_function("locate", 2, deterministic, |ctx| {
        let (Some(needle), Some(hay)) = (value_text(ctx.get_raw(0)), value_text(ctx.get_raw(1)))
        else {
            return Ok(None);
        };
        let hay_folded = fold(&hay);
        let needle_folded = fold(&needle);
        Ok(Some(match hay_folded.find(&needle_folded) {
            Some(at) => hay_folded[..at].chars().count() as i64 + 1,
            None => 0,
        }))
    })?;
    for (name, from_left) in [("left", true), ("right", false)] {
        conn.create_scalar_function(name, 2, deterministic, move |ctx| {
            let Some(text) = value_text(ctx.get_raw(0)) else {
                return Ok(None);
            };
            let n = ctx.get::<Option<i64>>(1).ok().flatten().unwrap_or(0).max(0) as usize;
            let count = text.chars().count();
            let n = n.min(count);
            Ok(Some(if from_left {
                text.chars().take(n).collect::<String>()
            } else {
                text.chars().skip(count - n).collect::<String>()
            }))
        })?;
    }
    for (name, upper) in [("lcase", false), ("ucase", true)] {
        conn.create_scalar_function(name, 1, deterministic, move |ctx| {
            Ok(value_text(ctx.get_raw(0)).map(|t| {
                if upper {
                    t.to_uppercase()
                } else {
                    t.to_lowercase()
                }
            }))
        })?;
    }
    conn.create_scalar_function("char_length", 1, deterministic, |ctx| {
        Ok(value_text(ctx.get_raw(0)).map(|t| t.chars().count() as i64))
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_matches_known_vectors() {
        assert_eq!(md5_hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(md5_hex(b"abc"), "900150983cd24fb0d6963f7d28e17f72");
    }

    #[test]
    fn python_floats() {
        assert_eq!(python_float(2011.0), "2011.0");
        assert_eq!(python_float(0.5), "0.5");
        assert_eq!(python_float(1e16), "1e+16");
        assert_eq!(python_float(1.5e-5), "1.5e-05");
        assert_eq!(python_float(-3.25), "-3.25");
    }

    #[test]
    fn mysql_numbers() {
        assert_eq!(mysql_number("12abc"), 12.0);
        assert_eq!(mysql_number("  -3.5e2x"), -350.0);
        assert_eq!(mysql_number("abc"), 0.0);
        assert_eq!(mysql_number("1,234"), 1.0);
        assert_eq!(mysql_number(".5"), 0.5);
        assert_eq!(mysql_number("7e"), 7.0);
    }

    #[test]
    fn folding_and_like() {
        assert_eq!(fold("Ångström CAFÉ"), "angstrom cafe");
        assert_eq!(fold("Cafe\u{301}"), "cafe");
        assert!(mysql_like("%cafe%", "Le Café", '\\'));
        assert!(mysql_like("j_mmy", "JIMMY", '\\'));
        assert!(!mysql_like("a\\%", "ab", '\\'));
        assert!(mysql_like("a\\%", "a%", '\\'));
        assert!(mysql_like("%a%b%c%", "xxaxxbxxcxx", '\\'));
        assert!(!mysql_like("%a%b%c", "xxaxxbxxcxx", '\\'));
        assert!(mysql_like("", "", '\\'));
        assert!(!mysql_like("", "a", '\\'));
    }

    #[test]
    fn rows_render_like_python() {
        let rows = vec![
            vec![Value::Text("it's".into()), Value::Integer(3)],
            vec![Value::Null, Value::Real(2.0)],
        ];
        assert_eq!(render_rows(&rows, false), r#"[("it's", 3), (None, 2.0)]"#);
        assert_eq!(
            render_rows(&[vec![Value::Text("a".into())]], false),
            "[('a',)]"
        );
        assert_eq!(render_rows(&[], false), "[]");
    }
}
