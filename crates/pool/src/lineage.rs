//! The lineage tree of a pool, for logs and reports.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use harness_core::{Harness, HarnessId};

use crate::SiblingPool;

/// Render `pool` as an indented tree: roots are the base and any member whose parent is not in
/// the pool; children follow in pool order.
pub(crate) fn render(pool: &SiblingPool) -> String {
    let ids = pool.ids();
    let mut children: BTreeMap<&HarnessId, Vec<usize>> = BTreeMap::new();
    let mut roots = Vec::new();
    for (i, member) in pool.members().iter().enumerate() {
        match &member.lineage.parent {
            Some(parent) if pool.contains(parent) && parent != &ids[i] => {
                children.entry(parent).or_default().push(i)
            }
            _ => roots.push(i),
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pool: {} members ({} auxiliary){}",
        pool.len(),
        pool.len() - 1,
        if pool.is_frozen() { ", frozen" } else { "" }
    );
    let last_root = roots.len().saturating_sub(1);
    for (r, &i) in roots.iter().enumerate() {
        line(&mut out, pool, i, "", r == last_root, true);
        walk(&mut out, pool, &ids, &children, i, "", r == last_root);
    }
    out
}

fn walk(
    out: &mut String,
    pool: &SiblingPool,
    ids: &[HarnessId],
    children: &BTreeMap<&HarnessId, Vec<usize>>,
    node: usize,
    prefix: &str,
    node_is_last: bool,
) {
    let Some(kids) = children.get(&ids[node]) else {
        return;
    };
    let child_prefix = format!("{prefix}{}", if node_is_last { "   " } else { "|  " });
    for (k, &child) in kids.iter().enumerate() {
        let last = k + 1 == kids.len();
        line(out, pool, child, &child_prefix, last, false);
        walk(out, pool, ids, children, child, &child_prefix, last);
    }
}

fn line(out: &mut String, pool: &SiblingPool, i: usize, prefix: &str, last: bool, root: bool) {
    let h: &Harness = &pool.members()[i];
    let id = h.id();
    let branch = if root {
        ""
    } else if last {
        "`- "
    } else {
        "|- "
    };
    let role = if &id == pool.base_id() {
        " base".to_string()
    } else {
        format!(" gen {}", h.lineage.generation)
    };
    let _ = write!(out, "{prefix}{branch}{} [{id}]{role}", h.name);
    if let Some(parent) = &h.lineage.parent
        && !pool.contains(parent)
    {
        let _ = write!(out, " (parent {parent} not in pool)");
    }
    if let Some(direction) = &h.lineage.direction {
        let _ = write!(out, ": {direction}");
    }
    if !h.lineage.causes.is_empty() {
        let _ = write!(out, " [causes: {}]", h.lineage.causes.join(", "));
    }
    if let Some(eval) = &h.lineage.local_eval {
        let _ = write!(
            out,
            " [local: +{} repaired, -{} regressed of {}]",
            eval.repaired.len(),
            eval.regressed.len(),
            eval.tasks
        );
    }
    out.push('\n');
}
