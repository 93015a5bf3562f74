//! The similar-task index: which validation tasks resemble a task, by BM25 over instructions and
//! task features (the voters' "outcomes on similar validation tasks", and the Rule Router).
//!
//! BM25 comes from the `bm25` crate; documents and queries are tokenised by
//! [`crate::features::task_tokens`], so a task's environment, category and difficulty count like
//! instruction words. Test tasks are refused: they never feed the router.

use std::cmp::Ordering;

use bm25::{SearchEngine, SearchEngineBuilder, Tokenizer};
use harness_core::{Split, Task};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::features::{FeatureSource, tokens};

/// Tokenises documents and queries for BM25; the index stores pre-rendered token text, so
/// this only splits it again.
#[derive(Debug, Clone, Copy, Default)]
struct FeatureTokenizer;

impl Tokenizer for FeatureTokenizer {
    fn tokenize(&self, input_text: &str) -> Vec<String> {
        tokens(input_text)
    }
}

/// One neighbour of a query task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Neighbour {
    /// The indexed task's id.
    pub task_id: String,
    /// Its BM25 score relative to the best neighbour's (the best is 1).
    pub similarity: f64,
}

/// A BM25 index over validation tasks.
pub struct SimilarIndex {
    ids: Vec<String>,
    engine: SearchEngine<usize, u32, FeatureTokenizer>,
    source: FeatureSource,
}

impl std::fmt::Debug for SimilarIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimilarIndex")
            .field("tasks", &self.ids.len())
            .finish()
    }
}

fn document(task: &Task, source: FeatureSource) -> String {
    crate::features::task_tokens(task, source).join(" ")
}

impl SimilarIndex {
    /// Index `tasks` by their features from `source`; a test task is an error naming it.
    pub fn build(tasks: &[Task], source: FeatureSource) -> Result<Self> {
        if let Some(t) = tasks.iter().find(|t| t.split == Split::Test) {
            return Err(Error::TestTask {
                task: t.id.clone(),
                context: "similar-task index".into(),
            });
        }
        let documents: Vec<bm25::Document<usize>> = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| bm25::Document::new(i, document(t, source)))
            .collect();
        // Fitting BM25 to an empty corpus would divide by a zero average length.
        let engine = if documents.is_empty() {
            SearchEngineBuilder::<usize, u32, FeatureTokenizer>::with_avgdl(1.0).build()
        } else {
            SearchEngineBuilder::<usize, u32, FeatureTokenizer>::with_tokenizer_and_documents(
                FeatureTokenizer,
                documents,
            )
            .build()
        };
        Ok(SimilarIndex {
            ids: tasks.iter().map(|t| t.id.clone()).collect(),
            engine,
            source,
        })
    }

    /// Indexed tasks.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Up to `n` indexed tasks most similar to `task` (never `task` itself), best first; ties by
    /// task id so results do not depend on hash order.
    pub fn similar(&self, task: &Task, n: usize) -> Vec<Neighbour> {
        let mut hits: Vec<(f32, &str)> = self
            .engine
            .search(&document(task, self.source), None)
            .into_iter()
            .filter_map(|r| {
                let id = self.ids.get(r.document.id)?.as_str();
                (id != task.id && r.score > 0.0).then_some((r.score, id))
            })
            .collect();
        hits.sort_by(|a, b| {
            b.0.partial_cmp(&a.0)
                .unwrap_or(Ordering::Equal)
                .then_with(|| a.1.cmp(b.1))
        });
        hits.truncate(n);
        let best = hits.first().map_or(1.0, |h| h.0);
        hits.into_iter()
            .map(|(score, id)| Neighbour {
                task_id: id.to_string(),
                similarity: f64::from(score / best),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(id: &str, split: Split, instruction: &str, template: &str) -> Task {
        let mut t = Task::new(id, "appworld", split, instruction, 0);
        t.metadata = json!({"template": template});
        t
    }

    #[test]
    fn finds_tasks_of_the_same_family_first_and_refuses_test_tasks() {
        let tasks = vec![
            task(
                "v1",
                Split::Validation,
                "Count emails from Ann in inbox and spam.",
                "mail_count",
            ),
            task(
                "v2",
                Split::Validation,
                "Transfer money to Bob and check the balance.",
                "transfer_readback",
            ),
            task(
                "v3",
                Split::Validation,
                "Count emails from Carl in the archive.",
                "mail_count",
            ),
        ];
        let index = SimilarIndex::build(&tasks, FeatureSource::Metadata).unwrap();
        let query = task(
            "q",
            Split::Test,
            "How many emails did Dana send to my inbox?",
            "mail_count",
        );
        let got = index.similar(&query, 2);
        let ids: Vec<&str> = got.iter().map(|n| n.task_id.as_str()).collect();
        assert_eq!(ids.len(), 2);
        assert!(ids.iter().all(|id| *id == "v1" || *id == "v3"), "{ids:?}");
        assert_eq!(got[0].similarity, 1.0);
        // The query itself, when indexed, is never its own neighbour.
        assert!(
            index
                .similar(&tasks[0], 5)
                .iter()
                .all(|n| n.task_id != "v1")
        );

        let empty = SimilarIndex::build(&[], FeatureSource::Text).unwrap();
        assert!(empty.is_empty() && empty.similar(&query, 3).is_empty());

        let mut bad = tasks.clone();
        bad.push(task("t9", Split::Test, "x", "mail_count"));
        let err = SimilarIndex::build(&bad, FeatureSource::Text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`t9`"), "{err}");
    }
}
