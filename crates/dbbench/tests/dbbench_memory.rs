//! DBBench's memory limit. SQLite's hard heap limit is process-wide, so this test has a test
//! binary (a process) of its own: the low limit it sets cannot starve other tests.

use std::time::{Duration, Instant};

use harness_core::Split;
use harness_dbbench::{self as dbbench, DbBench, DbLimits, DbSession};

const PEOPLE: &str = r#"{"description": "How many people?", "label": ["4"], "type": ["other"], "table": {"table_name": "People List", "table_info": {"columns": [{"name": "Name"}, {"name": "Goals"}], "rows": [["Anna", "17"], ["Bob", "42"], ["José Müller", "3"], ["O'Neil", "84"]]}}}"#;

/// A sort of 4,000 rows of 100 KB (400 MB), inside every other budget: without the heap
/// limit it succeeds and the process holds all of it at once.
const SORT_ATTACK: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 4000) \
    SELECT x FROM c ORDER BY printf('%.*c', 100000, 'x') || x";

/// The same rows held by a materialised subquery and made distinct.
const DISTINCT_ATTACK: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 4000), \
    big(p) AS MATERIALIZED (SELECT printf('%.*c', 100000, 'x') || x FROM c) \
    SELECT COUNT(*) FROM (SELECT DISTINCT p FROM big)";

#[test]
fn a_memory_attack_ends_with_an_error_and_the_session_goes_on() {
    let tasks = dbbench::parse_jsonl(PEOPLE, std::path::Path::new("people.jsonl")).unwrap();
    let env = DbBench::from_tasks("people", Split::Test, tasks);
    let limits = DbLimits {
        statement_time: Duration::from_secs(20),
        statement_ops: u64::MAX,
        process_heap_bytes: 64 << 20,
        ..DbLimits::default()
    };
    let session = DbSession::new(&env.all_tasks()[0], limits).unwrap();
    for attack in [SORT_ATTACK, DISTINCT_ATTACK] {
        let started = Instant::now();
        let observation = session.execute_sql(attack);
        assert!(observation.error, "{attack}: {}", observation.text);
        assert!(
            observation.text.contains("memory"),
            "{attack}: {}",
            observation.text
        );
        assert!(started.elapsed() < limits.statement_time);
        let after = session.execute_sql("SELECT COUNT(*) FROM `People List`");
        assert!(!after.error, "{}", after.text);
        assert_eq!(after.text, "[(4,)]");
    }
}
