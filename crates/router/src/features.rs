//! Task features: the "when" side of a profile entry and the text the similarity index reads.
//!
//! By default ([`FeatureSource::Text`]) a task is described only by what a router deployed on
//! new tasks would see: its environment and the keywords of its instruction. Its family
//! condition is the instruction's leading keyword (`dbbench, keywords average`), so tasks asked
//! the same way share profile entries. With [`FeatureSource::Metadata`] the generator's labels
//! join in: the category (the app world's template, DBBench's question type, the repository of a
//! repair task, or a `category` in the metadata) and the difficulty. Those labels can map one to
//! one onto what a benchmark plants, which the paper's router never sees, so they are opt-in.
//! Conditions are plain text so that an LLM profiler's free-text `when` and the built-in
//! profiler's structured one are matched against tasks the same way ([`condition_match`]).

use std::collections::BTreeSet;

use harness_core::Task;
use serde::{Deserialize, Serialize};

/// Words that carry no task condition.
const STOP_WORDS: &[&str] = &[
    "a",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "by",
    "can",
    "category",
    "difficulty",
    "do",
    "does",
    "each",
    "every",
    "for",
    "from",
    "has",
    "have",
    "how",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "keywords",
    "me",
    "my",
    "of",
    "on",
    "or",
    "please",
    "so",
    "task",
    "tasks",
    "template",
    "that",
    "the",
    "their",
    "them",
    "then",
    "there",
    "this",
    "to",
    "what",
    "when",
    "where",
    "which",
    "who",
    "with",
    "you",
    "your",
];

/// Lowercase word tokens of `text`: runs of letters, digits, `_` and `-` (so `mail_count` and
/// `difficulty-2` stay whole), without stop words or one-character tokens.
pub fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
        .map(|w| w.trim_matches('-').to_lowercase())
        .filter(|w| w.chars().count() >= 2 && !STOP_WORDS.contains(&w.as_str()))
        .collect()
}

/// Where task features come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureSource {
    /// The environment and the instruction's words only (the default).
    #[default]
    Text,
    /// Also the generator's labels in the task metadata (category, difficulty).
    Metadata,
}

impl FeatureSource {
    /// The setting's value (`text` or `metadata`).
    pub fn as_str(self) -> &'static str {
        match self {
            FeatureSource::Text => "text",
            FeatureSource::Metadata => "metadata",
        }
    }

    /// Parse a setting's value.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "text" => Some(FeatureSource::Text),
            "metadata" => Some(FeatureSource::Metadata),
            _ => None,
        }
    }
}

impl std::fmt::Display for FeatureSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the router knows about a task before running it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFeatures {
    /// The environment.
    pub env: String,
    /// Template, question type, repository or `metadata.category` (metadata features only).
    pub category: Option<String>,
    /// `metadata.difficulty`, when present (metadata features only).
    pub difficulty: Option<u64>,
    /// Up to eight distinct instruction keywords, in order of appearance.
    pub keywords: Vec<String>,
}

const KEYWORDS: usize = 8;

impl TaskFeatures {
    /// The features of a task from `source` (test tasks included: describing a task is not
    /// learning from it).
    pub fn of(task: &Task, source: FeatureSource) -> Self {
        let meta = &task.metadata;
        let text = |key: &str| meta.get(key).and_then(|v| v.as_str()).map(str::to_string);
        let with_meta = source == FeatureSource::Metadata;
        let category = with_meta
            .then(|| {
                text("template")
                    .or_else(|| text("category"))
                    .or_else(|| text("kind"))
                    .or_else(|| text("repo"))
            })
            .flatten();
        let mut seen = BTreeSet::new();
        let keywords = tokens(&task.instruction)
            .into_iter()
            .filter(|w| w.chars().any(char::is_alphabetic) && w.len() >= 4)
            .filter(|w| seen.insert(w.clone()))
            .take(KEYWORDS)
            .collect();
        TaskFeatures {
            env: task.env.clone(),
            category,
            difficulty: with_meta
                .then(|| meta.get("difficulty").and_then(|v| v.as_u64()))
                .flatten(),
            keywords,
        }
    }

    /// The condition shared by tasks of the same family: environment and category
    /// (`appworld, category mail_count`) when a category is known, else environment and the
    /// instruction's leading keyword (`dbbench, keywords average`).
    pub fn family_condition(&self) -> String {
        match (&self.category, self.keywords.first()) {
            (Some(c), _) => format!("{}, category {c}", self.env),
            (None, Some(k)) => format!("{}, keywords {k}", self.env),
            (None, None) => self.env.clone(),
        }
    }

    /// The full condition of this one task: family, difficulty and keywords.
    pub fn task_condition(&self) -> String {
        let mut out = self.family_condition();
        if let Some(d) = self.difficulty {
            out.push_str(&format!(", difficulty-{d}"));
        }
        if !self.keywords.is_empty() {
            out.push_str(&format!(", keywords {}", self.keywords.join(" ")));
        }
        out
    }

    /// Feature tokens (environment, category, difficulty), without the instruction.
    pub fn feature_tokens(&self) -> Vec<String> {
        let mut out = tokens(&self.env);
        if let Some(c) = &self.category {
            out.extend(tokens(c));
        }
        if let Some(d) = self.difficulty {
            out.push(format!("difficulty-{d}"));
        }
        out
    }
}

/// The tokens a task offers to condition matching and to the similarity index: its
/// instruction's words and its feature tokens from `source`.
pub fn task_tokens(task: &Task, source: FeatureSource) -> Vec<String> {
    let mut out = tokens(&task.instruction);
    out.extend(TaskFeatures::of(task, source).feature_tokens());
    out
}

/// How well a profile entry's condition matches a task: the fraction of the condition's
/// distinct tokens that the task has (0 when the condition has none).
pub fn condition_match(when: &str, task_tokens: &BTreeSet<String>) -> f64 {
    let wanted: BTreeSet<String> = tokens(when).into_iter().collect();
    if wanted.is_empty() {
        return 0.0;
    }
    wanted.iter().filter(|t| task_tokens.contains(*t)).count() as f64 / wanted.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_core::Split;
    use serde_json::json;

    #[test]
    fn features_and_matching() {
        let mut task = Task::new(
            "appworld/validation-001",
            "appworld",
            Split::Validation,
            "Count the emails from Ann in my inbox, spam and archive.",
            1,
        );
        task.metadata = json!({"template": "mail_count", "difficulty": 2});
        let f = TaskFeatures::of(&task, FeatureSource::Metadata);
        assert_eq!(f.category.as_deref(), Some("mail_count"));
        assert_eq!(f.family_condition(), "appworld, category mail_count");
        assert!(f.task_condition().contains("difficulty-2"));
        assert!(f.keywords.contains(&"inbox".to_string()));
        let have: BTreeSet<String> = task_tokens(&task, FeatureSource::Metadata)
            .into_iter()
            .collect();
        assert_eq!(condition_match(&f.task_condition(), &have), 1.0);
        assert_eq!(condition_match("dbbench, category counting", &have), 0.0);
        assert_eq!(condition_match("", &have), 0.0);
        assert!((condition_match("appworld, category returns_window", &have) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn text_features_ignore_the_generators_labels() {
        let mut task = Task::new(
            "dbbench/validation-001",
            "dbbench",
            Split::Validation,
            "What is the average price of the products with category toys?",
            1,
        );
        task.metadata = json!({"kind": "aggregation-AVG", "difficulty": 2});
        let f = TaskFeatures::of(&task, FeatureSource::Text);
        assert_eq!(f.category, None);
        assert_eq!(f.difficulty, None);
        assert_eq!(f.family_condition(), "dbbench, keywords average");
        let have: BTreeSet<String> = task_tokens(&task, FeatureSource::Text)
            .into_iter()
            .collect();
        assert!(!have.iter().any(|t| t.contains("aggregation")), "{have:?}");
        assert!(!have.contains("difficulty-2"));
        assert_eq!(condition_match(&f.family_condition(), &have), 1.0);
        // The label is there for whoever opts in.
        let with_meta: BTreeSet<String> = task_tokens(&task, FeatureSource::Metadata)
            .into_iter()
            .collect();
        assert!(with_meta.contains("aggregation-avg"), "{with_meta:?}");
        assert_eq!(FeatureSource::parse("text"), Some(FeatureSource::Text));
        assert_eq!(FeatureSource::parse("kind"), None);
    }
}
