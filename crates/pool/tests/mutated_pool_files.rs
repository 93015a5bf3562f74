//! `SiblingPool::load` on hostile copies of a saved pool (issue 25 item 5): every mutant of
//! `pool.json` or of a member file is an error naming that file, never a panic, and loading stays
//! within a memory budget.

use std::path::Path;

use harness_core::Harness;
use harness_pool::{HARNESS_DIR, POOL_FILE, SiblingPool};
use harness_testkit::mutate::{self, Mutant, MutantOutcome, TrackingAlloc};

#[global_allocator]
static ALLOC: TrackingAlloc = TrackingAlloc;

/// Generous for a pool of a few kilobytes.
const BUDGET: usize = 16 << 20;

fn saved_pool(dir: &Path) -> SiblingPool {
    let mut base = Harness::new("H0", "You solve tasks with tools. {guidance}");
    base.prompt
        .slots
        .insert("guidance".into(), "Look before you act.".into());
    base.limits.max_env_actions = 20;
    let siblings = [(10, "fewer actions"), (12, "a few more")].map(|(actions, why)| {
        let mut h = base.clone();
        h.name = format!("S{actions}");
        h.description = why.into();
        h.limits.max_env_actions = actions;
        h
    });
    let pool = SiblingPool::starter(
        base,
        siblings,
        serde_json::json!({"starter": "test", "budgets": [7, 8, 8], "seed": 42}),
    )
    .unwrap();
    pool.save(dir).unwrap();
    pool
}

#[test]
fn mutated_pool_files_are_errors_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let pool = saved_pool(dir.path());
    assert_eq!(SiblingPool::load(dir.path()).unwrap(), pool);
    let index = dir.path().join(POOL_FILE);
    let member = dir
        .path()
        .join(HARNESS_DIR)
        .join(format!("{}.json", pool.ids()[1]));
    let mut refused = 0;
    let mut total = 0;
    for file in [&index, &member] {
        let valid = std::fs::read(file).unwrap();
        let mut mutants = mutate::text_mutants(&valid, 25);
        mutants.extend(mutate::json_depth_bombs());
        if file == &index {
            // Ids that are not an id's form, or that name a file outside the pool.
            let id = pool.ids()[1].to_string();
            let text = String::from_utf8(valid.clone()).unwrap();
            for hostile in [
                "../../../etc/passwd",
                "",
                "ABCDEF0123456789",
                "0123456789abcdef0",
            ] {
                mutants.push(Mutant::new(
                    format!("member id {hostile:?}"),
                    text.replace(&id, hostile),
                ));
            }
            // A long member list is read (the file holds it) and refused at the first repeat.
            let many = vec![format!("\"{id}\""); 100_000].join(",");
            mutants.push(Mutant::new(
                "a member listed 100000 times",
                text.replace(&format!("\"{id}\""), &many),
            ));
        }
        for Mutant { what, bytes } in &mutants {
            assert!(bytes != &valid, "{what}: not a mutant");
            std::fs::write(file, bytes).unwrap();
            total += 1;
            let what = format!("{}: {what}", file.display());
            if let MutantOutcome::Refused(_) =
                mutate::check(&what, file, BUDGET + 64 * bytes.len(), || {
                    SiblingPool::load(dir.path())
                })
            {
                refused += 1;
            }
        }
        std::fs::write(file, &valid).unwrap();
    }
    assert!(refused * 2 > total, "{refused} of {total}");
    SiblingPool::load(dir.path()).expect("the restored pool loads");
}
