//! DBBench-style tasks generated from a seed, so the default pipeline needs no downloaded data.
//!
//! Each task gets its own table from one of several domains (a name column, a category column
//! and numeric columns, every cell TEXT) and a question of one of the eleven types
//! ([`QuestionType::ALL`]). The generator writes MySQL-style gold SQL and computes the ground
//! truth by running it on the task's SQLite database: the result rows for questions, the table
//! hash after the change for INSERT/UPDATE/DELETE. Types cycle with the task index, so every
//! split holds every type.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rusqlite::types::Value;

use super::data::{DbTable, DbTask, QuestionType};
use super::db::{Database, DbLimits, python_float};
use super::sql::{quote_ident, sqlite_string};
use super::{ENV_NAME, to_task};
use harness_core::{Split, Task};

/// How many tasks of each split to generate, and from which seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratorConfig {
    /// The seed every table and question derives from.
    pub seed: u64,
    /// Training tasks.
    pub train: usize,
    /// Validation tasks.
    pub validation: usize,
    /// Test tasks.
    pub test: usize,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig {
            seed: 0,
            train: 220,
            validation: 44,
            test: 44,
        }
    }
}

/// A numeric column: name, range, decimals.
struct NumColumn {
    name: &'static str,
    /// What a value measures, for questions ("points", "goals scored").
    noun: &'static str,
    low: i64,
    high: i64,
    decimals: u32,
}

/// A table template.
struct Domain {
    tables: &'static [&'static str],
    /// The rows' kind, singular and plural ("club", "clubs").
    entity: (&'static str, &'static str),
    name_column: &'static str,
    first: &'static [&'static str],
    second: &'static [&'static str],
    category_column: &'static str,
    categories: &'static [&'static str],
    numbers: &'static [NumColumn],
}

const fn num(
    name: &'static str,
    noun: &'static str,
    low: i64,
    high: i64,
    decimals: u32,
) -> NumColumn {
    NumColumn {
        name,
        noun,
        low,
        high,
        decimals,
    }
}

const DOMAINS: &[Domain] = &[
    Domain {
        tables: &["League Table", "football_standings", "Club Results 2019"],
        entity: ("club", "clubs"),
        name_column: "Club",
        first: &[
            "North", "Port", "Old", "Royal", "Union", "Lake", "Green", "Saint", "East", "River",
        ],
        second: &[
            "Rovers",
            "United",
            "Athletic",
            "Wanderers",
            "Albion",
            "City",
            "Town",
            "Harriers",
        ],
        category_column: "Division",
        categories: &["Premier", "First", "Second", "Regional"],
        numbers: &[
            num("Played", "games played", 20, 38, 0),
            num("Won", "wins", 0, 25, 0),
            num("Goals for", "goals scored", 10, 90, 0),
            num("Points", "points", 5, 85, 0),
        ],
    },
    Domain {
        tables: &["Film Releases", "box_office", "Movies of the Decade"],
        entity: ("film", "films"),
        name_column: "Title",
        first: &[
            "Silent", "Golden", "Last", "Broken", "Hidden", "Paper", "Winter", "Electric",
            "Distant", "Crimson",
        ],
        second: &[
            "Harbor", "Empire", "Garden", "Signal", "Mirror", "Voyage", "Horizon", "Letters",
        ],
        category_column: "Genre",
        categories: &["Drama", "Comedy", "Thriller", "Documentary", "Animation"],
        numbers: &[
            num("Year", "release year", 1990, 2023, 0),
            num("Runtime (min)", "runtime in minutes", 80, 180, 0),
            num("Gross ($M)", "gross in millions of dollars", 1, 900, 1),
            num("Rating", "rating", 30, 95, 1),
        ],
    },
    Domain {
        tables: &["City Statistics", "towns_by_region", "Municipalities"],
        entity: ("city", "cities"),
        name_column: "City",
        first: &[
            "San", "New", "Fort", "Mount", "Bel", "Val", "Santa", "Grand", "Little", "Port",
        ],
        second: &[
            "Haven", "Marais", "Rock", "Vista", "Ridge", "Falls", "Mesa", "Brook", "Crossing",
        ],
        category_column: "Region",
        categories: &["North", "South", "Coast", "Highlands", "Île-de-Rivière"],
        numbers: &[
            num("Population", "population", 2_000, 900_000, 0),
            num("Area (km²)", "area in square kilometres", 5, 800, 1),
            num("Founded", "founding year", 1500, 1990, 0),
            num("Elevation (m)", "elevation in metres", 0, 2400, 0),
        ],
    },
    Domain {
        tables: &["Album Sales", "discography", "Record Catalogue"],
        entity: ("album", "albums"),
        name_column: "Album",
        first: &[
            "Midnight", "Neon", "Velvet", "Static", "Paper", "Ocean", "Glass", "Wild", "Quiet",
            "Northern",
        ],
        second: &[
            "Dreams", "Lights", "Roads", "Echoes", "Hearts", "Stories", "Tides", "Machines",
        ],
        category_column: "Label",
        categories: &["Atlas", "Blue Note", "Harvest", "Sub Pop", "Motown"],
        numbers: &[
            num("Year", "release year", 1965, 2022, 0),
            num("Tracks", "number of tracks", 8, 20, 0),
            num("Copies sold", "copies sold", 10_000, 5_000_000, 0),
            num("Peak position", "peak chart position", 1, 100, 0),
        ],
    },
    Domain {
        tables: &["Race Results", "grand_prix_drivers", "Season Standings"],
        entity: ("driver", "drivers"),
        name_column: "Driver",
        first: &[
            "Ana", "Marco", "Lena", "Tomás", "Yuki", "Omar", "Sofia", "Karl", "Inès", "Raj",
        ],
        second: &[
            "Silva", "Rossi", "Berg", "Novak", "Tanaka", "Haddad", "Moreau", "Fischer", "Kaur",
        ],
        category_column: "Team",
        categories: &["Falcon", "Apex Racing", "Meridian", "Stellar"],
        numbers: &[
            num("Races", "races started", 5, 22, 0),
            num("Wins", "wins", 0, 12, 0),
            num("Podiums", "podiums", 0, 18, 0),
            num("Points", "points", 0, 420, 1),
        ],
    },
    Domain {
        tables: &["Staff Directory", "employees", "Payroll 2021"],
        entity: ("employee", "employees"),
        name_column: "Name",
        first: &[
            "Alice", "Bruno", "Chloé", "Dmitri", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas",
        ],
        second: &[
            "Adams", "Baker", "Costa", "Duval", "Evans", "Fuentes", "Garcia", "Horvat", "Ito",
        ],
        category_column: "Department",
        categories: &["Sales", "Engineering", "Finance", "Support", "Legal"],
        numbers: &[
            num("Age", "age", 21, 64, 0),
            num("Salary", "salary", 28_000, 160_000, 0),
            num("Years of service", "years of service", 0, 35, 0),
            num("Rating", "performance rating", 10, 50, 1),
        ],
    },
];

fn format_number(value: i64, decimals: u32) -> String {
    if decimals == 0 {
        return value.to_string();
    }
    let scale = 10i64.pow(decimals);
    let sign = if value < 0 { "-" } else { "" };
    let v = value.abs();
    format!(
        "{sign}{}.{:0width$}",
        v / scale,
        v % scale,
        width = decimals as usize
    )
}

fn random_number(rng: &mut ChaCha8Rng, column: &NumColumn) -> String {
    let scale = 10i64.pow(column.decimals);
    format_number(
        rng.gen_range(column.low * scale..=column.high * scale),
        column.decimals,
    )
}

struct Built {
    domain: &'static Domain,
    table: DbTable,
}

fn build_table(rng: &mut ChaCha8Rng) -> Built {
    let domain = &DOMAINS[rng.gen_range(0..DOMAINS.len())];
    let name = domain.tables[rng.gen_range(0..domain.tables.len())].to_string();
    let mut names: Vec<String> = domain
        .first
        .iter()
        .flat_map(|a| domain.second.iter().map(move |b| format!("{a} {b}")))
        .collect();
    names.shuffle(rng);
    let count = rng.gen_range(8..=20);
    let mut columns = vec![
        domain.name_column.to_string(),
        domain.category_column.to_string(),
    ];
    columns.extend(domain.numbers.iter().map(|n| n.name.to_string()));
    let rows = names
        .into_iter()
        .take(count)
        .map(|entity| {
            let mut row = vec![
                entity,
                domain.categories[rng.gen_range(0..domain.categories.len())].to_string(),
            ];
            row.extend(domain.numbers.iter().map(|n| random_number(rng, n)));
            row
        })
        .collect();
    Built {
        domain,
        table: DbTable {
            name,
            columns,
            rows,
        },
    }
}

fn value_text(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Integer(i) => i.to_string(),
        Value::Real(r) => python_float(*r),
        Value::Text(t) => t.clone(),
        Value::Blob(b) => String::from_utf8_lossy(b).into_owned(),
    }
}

/// A question or change, before its ground truth is computed.
struct Draft {
    question: String,
    sql: String,
    /// For ranking: a query of the top two ranked values, which must differ.
    tie_check: Option<String>,
}

fn draft(kind: QuestionType, built: &Built, rng: &mut ChaCha8Rng) -> Draft {
    let d = built.domain;
    let t = &built.table;
    let table = quote_ident(&t.name);
    let name_col = quote_ident(d.name_column);
    let cat_col = quote_ident(d.category_column);
    let (one, many) = d.entity;
    let row = &t.rows[rng.gen_range(0..t.rows.len())];
    let num_index = rng.gen_range(0..d.numbers.len());
    let number = &d.numbers[num_index];
    let num_col = quote_ident(number.name);
    let num_value = |row: &[String]| row[2 + num_index].clone();
    let category = &row[1];
    let numeric = format!("{num_col} + 0");
    match kind {
        QuestionType::Other => Draft {
            question: format!("What is the {} of the {one} {}?", number.noun, row[0]),
            sql: format!(
                "SELECT {num_col} FROM {table} WHERE {name_col} = {}",
                sqlite_string(&row[0])
            ),
            tie_check: None,
        },
        QuestionType::Counting => Draft {
            question: format!(
                "How many {many} in the table have {} as their {}?",
                category,
                d.category_column.to_lowercase()
            ),
            sql: format!(
                "SELECT COUNT(*) FROM {table} WHERE {cat_col} = {}",
                sqlite_string(category)
            ),
            tie_check: None,
        },
        QuestionType::Comparison => {
            let threshold = num_value(row);
            let (word, op) = if rng.gen_bool(0.5) {
                ("more than", ">")
            } else {
                ("less than", "<")
            };
            Draft {
                question: format!(
                    "Which {many} have {word} {threshold} {}? List their {}.",
                    number.noun,
                    d.name_column.to_lowercase()
                ),
                sql: format!("SELECT {name_col} FROM {table} WHERE {num_col} {op} {threshold}"),
                tie_check: None,
            }
        }
        QuestionType::Ranking => {
            let (word, order) = if rng.gen_bool(0.5) {
                ("highest", "DESC")
            } else {
                ("lowest", "ASC")
            };
            Draft {
                question: format!("Which {one} has the {word} {}?", number.noun),
                sql: format!("SELECT {name_col} FROM {table} ORDER BY {numeric} {order} LIMIT 1"),
                tie_check: Some(format!(
                    "SELECT {numeric} FROM {table} ORDER BY {numeric} {order} LIMIT 2"
                )),
            }
        }
        QuestionType::AggregationSum => Draft {
            question: format!(
                "What is the total {} of the {many} with {} {}?",
                number.noun,
                d.category_column.to_lowercase(),
                category
            ),
            sql: format!(
                "SELECT SUM({num_col}) FROM {table} WHERE {cat_col} = {}",
                sqlite_string(category)
            ),
            tie_check: None,
        },
        QuestionType::AggregationMin | QuestionType::AggregationMax => {
            let (word, func) = if kind == QuestionType::AggregationMin {
                ("smallest", "MIN")
            } else {
                ("largest", "MAX")
            };
            Draft {
                question: format!(
                    "What is the {word} {} among {many} with {} {}?",
                    number.noun,
                    d.category_column.to_lowercase(),
                    category
                ),
                sql: format!(
                    "SELECT {func}({numeric}) FROM {table} WHERE {cat_col} = {}",
                    sqlite_string(category)
                ),
                tie_check: None,
            }
        }
        QuestionType::AggregationAvg => Draft {
            question: format!(
                "What is the average {} of the {many} with {} {}?",
                number.noun,
                d.category_column.to_lowercase(),
                category
            ),
            sql: format!(
                "SELECT AVG({num_col}) FROM {table} WHERE {cat_col} = {}",
                sqlite_string(category)
            ),
            tie_check: None,
        },
        QuestionType::Insert => {
            let existing: Vec<&str> = t.rows.iter().map(|r| r[0].as_str()).collect();
            let candidates: Vec<String> = d
                .first
                .iter()
                .flat_map(|a| d.second.iter().map(move |b| format!("{a} {b}")))
                .filter(|n| !existing.contains(&n.as_str()))
                .collect();
            let new_name = candidates
                .choose(rng)
                .cloned()
                .unwrap_or_else(|| format!("New {one}"));
            let new_category = d.categories[rng.gen_range(0..d.categories.len())];
            let mut values = vec![new_name.clone(), new_category.to_string()];
            values.extend(d.numbers.iter().map(|n| random_number(rng, n)));
            let described: Vec<String> = d
                .numbers
                .iter()
                .zip(&values[2..])
                .map(|(n, v)| format!("{} {v}", n.name))
                .collect();
            let columns: Vec<String> = t.columns.iter().map(|c| quote_ident(c)).collect();
            let literals: Vec<String> = values.iter().map(|v| sqlite_string(v)).collect();
            Draft {
                question: format!(
                    "Add the {one} {new_name} to the table {}: {} {new_category}, {}.",
                    t.name,
                    d.category_column,
                    described.join(", ")
                ),
                sql: format!(
                    "INSERT INTO {table} ({}) VALUES ({})",
                    columns.join(", "),
                    literals.join(", ")
                ),
                tie_check: None,
            }
        }
        QuestionType::Update => {
            let new_value = random_number(rng, number);
            Draft {
                question: format!(
                    "The {one} {} now has {new_value} {}. Update the {} column of the table accordingly.",
                    row[0], number.noun, number.name
                ),
                sql: format!(
                    "UPDATE {table} SET {num_col} = {} WHERE {name_col} = {}",
                    sqlite_string(&new_value),
                    sqlite_string(&row[0])
                ),
                tie_check: None,
            }
        }
        QuestionType::Delete => Draft {
            question: format!(
                "Remove every {one} whose {} is {category} from the table {}.",
                d.category_column.to_lowercase(),
                t.name
            ),
            sql: format!(
                "DELETE FROM {table} WHERE {cat_col} = {}",
                sqlite_string(category)
            ),
            tie_check: None,
        },
    }
}

/// One task of type `kind` from `seed`; `None` when the draw gave a degenerate question (an
/// empty result, a tie for the top), so the caller draws again.
fn try_task(kind: QuestionType, rng: &mut ChaCha8Rng) -> Option<DbTask> {
    let built = build_table(rng);
    let d = draft(kind, &built, rng);
    let db = Database::create(std::slice::from_ref(&built.table), DbLimits::default()).ok()?;
    let (label, answer_md5) = if kind.is_modification() {
        let before = db.tables_hash(std::slice::from_ref(&built.table)).ok()?;
        let outcome = db.execute(&d.sql);
        if outcome.error {
            return None;
        }
        let after = db.tables_hash(std::slice::from_ref(&built.table)).ok()?;
        // The change must change something, and must not empty the table.
        if after == before || after == "None" {
            return None;
        }
        (Vec::new(), Some(after))
    } else {
        let rows = db.query_values(&d.sql).ok()?;
        let values: Vec<String> = rows
            .iter()
            .filter_map(|r| r.first())
            .map(value_text)
            .collect();
        // No empty results, and no answer a guess of "0" or "none" would match.
        if values.is_empty()
            || values.iter().any(|v| super::answer::normalize(v) == "0")
            || values
                .iter()
                .any(|v| super::answer::as_number(v) == Some(0.0))
        {
            return None;
        }
        if let Some(check) = &d.tie_check {
            let top = db.query_values(check).ok()?;
            if top.len() == 2 && top[0] == top[1] {
                return None;
            }
        }
        (values, None)
    };
    Some(DbTask {
        question: d.question,
        table_info: String::new(),
        evidence: String::new(),
        kind: kind.as_str().to_string(),
        tables: vec![built.table],
        label,
        answer_md5,
        gold_sql: Some(d.sql),
    })
}

/// A task seed from the run seed, the split and the index (SplitMix64 mixing).
fn task_seed(seed: u64, split: Split, index: usize) -> u64 {
    let split_code = match split {
        Split::Train => 1u64,
        Split::Validation => 2,
        Split::Test => 3,
    };
    let mut z = seed
        ^ split_code.wrapping_mul(0xA24B_AED4_963E_E407)
        ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One generated task: split, index and seed fix it completely.
pub fn generate_task(seed: u64, split: Split, index: usize) -> Task {
    let kind = QuestionType::ALL[index % QuestionType::ALL.len()];
    let task_seed = task_seed(seed, split, index);
    let mut rng = ChaCha8Rng::seed_from_u64(task_seed);
    let db_task = loop {
        if let Some(task) = try_task(kind, &mut rng) {
            break task;
        }
    };
    to_task(
        &format!("{ENV_NAME}/gen-{split}-{index:04}"),
        split,
        task_seed,
        &db_task,
    )
}

/// Every split's tasks.
pub fn generate_tasks(config: &GeneratorConfig) -> Vec<Task> {
    let mut tasks = Vec::with_capacity(config.train + config.validation + config.test);
    for (split, count) in [
        (Split::Train, config.train),
        (Split::Validation, config.validation),
        (Split::Test, config.test),
    ] {
        tasks.extend((0..count).map(|i| generate_task(config.seed, split, i)));
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_format_with_decimals() {
        assert_eq!(format_number(1234, 1), "123.4");
        assert_eq!(format_number(5, 2), "0.05");
        assert_eq!(format_number(42, 0), "42");
    }

    #[test]
    fn generation_is_deterministic_and_covers_every_type() {
        let config = GeneratorConfig {
            seed: 3,
            train: 22,
            validation: 11,
            test: 11,
        };
        let a = generate_tasks(&config);
        let b = generate_tasks(&config);
        assert_eq!(a, b);
        for split in Split::ALL {
            let kinds: std::collections::BTreeSet<String> = a
                .iter()
                .filter(|t| t.split == split)
                .map(|t| super::super::db_task(t).unwrap().kind)
                .collect();
            assert_eq!(kinds.len(), QuestionType::ALL.len(), "{split}");
        }
        let other = generate_tasks(&GeneratorConfig { seed: 4, ..config });
        assert_ne!(a[0].metadata, other[0].metadata);
    }
}
