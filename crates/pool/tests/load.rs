//! Loading pool directories: round trips, and every broken pool gives a message naming the file.

use std::path::Path;

use harness_core::Harness;
use harness_pool::{Error, HARNESS_DIR, POOL_FILE, SiblingPool};

fn sibling(base: &Harness, name: &str, actions: u32) -> Harness {
    let mut h = base.clone();
    h.name = name.into();
    h.limits.max_env_actions = actions;
    h
}

fn pool() -> SiblingPool {
    let base = Harness::new("H0", "You solve tasks with tools.");
    let siblings = vec![sibling(&base, "S1", 10), sibling(&base, "S2", 12)];
    SiblingPool::starter(base, siblings, serde_json::json!({"starter": "test"})).unwrap()
}

fn saved() -> (tempfile::TempDir, SiblingPool) {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool();
    pool.save(dir.path()).unwrap();
    (dir, pool)
}

fn load_err(dir: &Path) -> String {
    match SiblingPool::load(dir) {
        Ok(_) => panic!("a broken pool loaded"),
        Err(e) => e.to_string(),
    }
}

fn edit_index(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(POOL_FILE);
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(&mut value);
    std::fs::write(path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
}

#[test]
fn round_trip_keeps_order_lineage_and_flags() {
    let (dir, pool) = saved();
    let loaded = SiblingPool::load(dir.path()).unwrap();
    assert_eq!(loaded, pool);
    assert!(loaded.is_frozen());
    let names: Vec<_> = loaded.members().iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["H0", "S1", "S2"]);
    for aux in loaded.auxiliaries() {
        assert_eq!(aux.lineage.parent.as_ref(), Some(loaded.base_id()));
        assert_eq!(aux.lineage.generation, 1);
    }
    assert_eq!(loaded.settings()["starter"], "test");
}

#[test]
fn missing_index_names_pool_json() {
    let dir = tempfile::tempdir().unwrap();
    let msg = load_err(dir.path());
    assert!(msg.contains(POOL_FILE), "{msg}");
}

#[test]
fn missing_member_file_names_the_file() {
    let (dir, pool) = saved();
    let id = pool.ids()[1].clone();
    let path = dir.path().join(HARNESS_DIR).join(format!("{id}.json"));
    std::fs::remove_file(&path).unwrap();
    let msg = load_err(dir.path());
    assert!(msg.contains(&format!("{id}.json")), "{msg}");
    assert!(msg.contains("missing"), "{msg}");
}

#[test]
fn hash_mismatch_names_the_file() {
    let (dir, pool) = saved();
    let id = pool.ids()[2].clone();
    let path = dir.path().join(HARNESS_DIR).join(format!("{id}.json"));
    let mut h = Harness::load(&path).unwrap();
    h.limits.max_env_actions = 99;
    std::fs::write(&path, h.to_json_pretty()).unwrap();
    let msg = load_err(dir.path());
    assert!(msg.contains(&format!("{id}.json")), "{msg}");
    assert!(msg.contains("content hash"), "{msg}");
}

#[test]
fn duplicate_id_is_rejected() {
    let (dir, pool) = saved();
    let id = pool.ids()[1].clone();
    edit_index(dir.path(), |v| {
        v["members"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!(id.0));
    });
    let msg = load_err(dir.path());
    assert!(
        msg.contains(POOL_FILE) && msg.contains("listed twice"),
        "{msg}"
    );
}

/// Ids become file names: one that is not 16 hex digits (`../x`) is refused before any file
/// is opened, naming pool.json and the field, so an index cannot read outside its pool.
#[test]
fn ids_that_escape_the_pool_are_refused() {
    let (dir, pool) = saved();
    // A harness outside the pool directory that `../` ids would reach.
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let pool_dir = outside.join("pool");
    pool.save(&pool_dir).unwrap();
    std::fs::write(
        outside.join("escape.json"),
        pool.members()[1].to_json_pretty(),
    )
    .unwrap();
    for (field, edit) in [
        ("members", "../../escape"),
        ("members", "..\\..\\escape"),
        ("members", "ABCDEF0123456789"),
        ("base", "../../escape"),
    ] {
        edit_index(&pool_dir, |v| {
            if field == "base" {
                v["base"] = serde_json::json!(edit);
            } else {
                v["members"][1] = serde_json::json!(edit);
            }
        });
        let msg = load_err(&pool_dir);
        assert!(
            msg.contains(POOL_FILE)
                && msg.contains(&format!("at `{field}`"))
                && msg.contains("not a harness id"),
            "{edit}: {msg}"
        );
        pool.save(&pool_dir).unwrap();
    }
}

#[test]
fn base_not_a_member_is_rejected() {
    let (dir, _) = saved();
    edit_index(dir.path(), |v| {
        v["members"].as_array_mut().unwrap().remove(0);
    });
    let msg = load_err(dir.path());
    assert!(
        msg.contains("at `base`") && msg.contains("not a member"),
        "{msg}"
    );
}

#[test]
fn invalid_harness_names_the_file_and_field() {
    let (dir, pool) = saved();
    let id = pool.ids()[1].clone();
    let path = dir.path().join(HARNESS_DIR).join(format!("{id}.json"));
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    value["limits"]["max_env_actions"] = serde_json::json!("thirty");
    std::fs::write(&path, value.to_string()).unwrap();
    let msg = load_err(dir.path());
    assert!(msg.contains(&format!("{id}.json")), "{msg}");
    assert!(msg.contains("max_env_actions"), "{msg}");
}

#[test]
fn unknown_index_field_is_rejected() {
    let (dir, _) = saved();
    edit_index(dir.path(), |v| v["extra"] = serde_json::json!(1));
    let msg = load_err(dir.path());
    assert!(msg.contains(POOL_FILE) && msg.contains("extra"), "{msg}");
}

#[test]
fn frozen_pool_refuses_additions_and_duplicates_are_refused() {
    let mut pool = pool();
    let late = Harness::new("late", "x");
    assert!(matches!(pool.add(late), Err(Error::Frozen(_))));

    let base = Harness::new("H0", "You solve tasks with tools.");
    let mut open = SiblingPool::new(base.clone()).unwrap();
    let mut twin = base.clone();
    twin.name = "twin".into();
    let err = open.add(twin).unwrap_err().to_string();
    assert!(err.contains("same content as member `H0`"), "{err}");
}

#[test]
fn lineage_tree_nests_children_under_parents() {
    let base = Harness::new("H0", "You solve tasks with tools.");
    let mut pool = SiblingPool::new(base.clone()).unwrap();
    let s1 = pool
        .add_sibling(sibling(&base, "S1", 10), 1, Some("fewer actions".into()))
        .unwrap();
    let mut grandchild = sibling(&base, "S1.1", 8);
    grandchild.lineage.parent = Some(s1.clone());
    grandchild.lineage.causes = vec!["budget-exhausted".into()];
    pool.add_sibling(grandchild, 2, None).unwrap();
    pool.add_sibling(sibling(&base, "S2", 12), 1, None).unwrap();
    let tree = pool.render_lineage();
    let lines: Vec<&str> = tree.lines().collect();
    assert!(lines[1].starts_with("H0 ["), "{tree}");
    assert!(
        lines[2].contains("S1 [") && lines[2].contains("fewer actions"),
        "{tree}"
    );
    assert!(
        lines[3].contains("S1.1") && lines[3].contains("budget-exhausted"),
        "{tree}"
    );
    // The grandchild is indented deeper than its parent.
    let depth = |l: &str| l.find(|c: char| c.is_alphanumeric()).unwrap();
    assert!(depth(lines[3]) > depth(lines[2]), "{tree}");
    assert!(lines[4].contains("S2 ["), "{tree}");
}
