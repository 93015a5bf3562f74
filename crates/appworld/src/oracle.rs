//! A scripted solver for every template: it reads each observation and decides the next call,
//! the way a careful agent would (paginate to the end, intersect, read back).
//!
//! The plan is written as straight-line code over a [`Replay`]: each call either returns the
//! observation already received for it or stops the plan and becomes the next action. The
//! oracle keeps the observations it has seen, so a harness that elides old observations from
//! the context does not confuse it.

use std::sync::Mutex;

use async_trait::async_trait;
use harness_core::{FinishReason, Policy, PolicyRequest, PolicyTurn, Result, Role, Task, ToolCall};
use regex::Regex;
use serde_json::{Value, json};

use super::apps::MAX_PAGE_SIZE;
use super::apps::account::sender;
use super::date::Date;
use super::templates::{Period, Spec, TransferKind};
use super::tool;

/// An oracle policy for one app-world task. It solves every built-in task under a harness
/// whose limits allow its calls (the base harness does) and that shows it each new
/// observation in full. It never reads the documentation, so a harness that blocks calls
/// until a schema lookup, or cuts observations short, will make it fail; it also ignores
/// hook messages. It reads its parameters from the task's metadata, never the ground truth:
/// every answer comes from what the apps return.
pub struct OraclePolicy {
    spec: Option<Spec>,
    page_size: usize,
    seen: Mutex<Vec<Value>>,
}

impl OraclePolicy {
    /// An oracle for `task` (the parameters come from `task.metadata.spec`).
    pub fn new(task: &Task) -> Self {
        let spec = task
            .metadata
            .get("spec")
            .and_then(|s| serde_json::from_value(s.clone()).ok());
        OraclePolicy {
            spec,
            page_size: MAX_PAGE_SIZE,
            seen: Mutex::new(Vec::new()),
        }
    }

    /// The same oracle paging with `page_size` items per page (1 to 20; the default is the
    /// largest, 20). With the APIs' default of 5 it shows what a careful agent that never
    /// raises the page size needs.
    pub fn with_page_size(mut self, page_size: usize) -> Self {
        self.page_size = page_size.clamp(1, MAX_PAGE_SIZE);
        self
    }
}

/// The calls of a plan so far, answered from recorded observations.
struct Replay<'a> {
    observations: &'a [Value],
    page_size: usize,
    next: usize,
}

type Step<T> = std::result::Result<T, ToolCall>;

impl Replay<'_> {
    fn call(&mut self, name: &str, arguments: Value) -> Step<Value> {
        match self.observations.get(self.next) {
            Some(value) => {
                self.next += 1;
                Ok(value.clone())
            }
            None => Err(ToolCall::new(name, arguments)),
        }
    }

    fn api(&mut self, app: &str, api: &str, arguments: Value) -> Step<Value> {
        self.call(
            tool::CALL_API,
            json!({"app": app, "api": api, "arguments": arguments}),
        )
    }

    /// Every item of a listing: pages of the largest size until a short page.
    fn all_pages(&mut self, app: &str, api: &str, arguments: Value, key: &str) -> Step<Vec<Value>> {
        let mut items = Vec::new();
        for page in 1.. {
            let mut args = arguments.clone();
            args["page"] = json!(page);
            args["page_size"] = json!(self.page_size);
            let result = self.api(app, api, args)?;
            let chunk = result
                .get(key)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let short = chunk.len() < self.page_size;
            items.extend(chunk);
            if short || page > 50 {
                break;
            }
        }
        Ok(items)
    }

    fn complete(&mut self, answer: String) -> Step<Value> {
        self.call(tool::COMPLETE_TASK, json!({"answer": answer}))
    }

    fn login(&mut self, app: &str) -> Step<String> {
        let profile = self.api("supervisor", "show_profile", json!({}))?;
        let passwords = self.api("supervisor", "show_account_passwords", json!({}))?;
        let password = passwords["passwords"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["app"] == app)
            .and_then(|p| p["password"].as_str())
            .unwrap_or_default()
            .to_string();
        let login = self.api(
            app,
            "login",
            json!({"email": profile["email"], "password": password}),
        )?;
        Ok(login["access_token"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }
}

fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn cents(v: &Value, key: &str) -> i64 {
    (v.get(key).and_then(Value::as_f64).unwrap_or_default() * 100.0).round() as i64
}

fn dollars(cents: i64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}

fn date(v: &Value, key: &str) -> Option<Date> {
    Date::parse(&text(v, key))
}

/// Today's date, from the supervisor's point of view: the newest thing the world knows is the
/// initial observation, which the oracle reads from the request.
fn plan(spec: &Spec, now: Date, r: &mut Replay<'_>) -> Step<Value> {
    match spec {
        Spec::MailCount {
            sender_email,
            folders,
            ..
        } => {
            let mut count = 0;
            for folder in folders {
                let emails = r.all_pages(
                    "mail",
                    "list_emails",
                    json!({"folder": folder.as_str()}),
                    "emails",
                )?;
                count += emails
                    .iter()
                    .filter(|e| text(e, "from").eq_ignore_ascii_case(sender_email))
                    .count();
            }
            r.complete(count.to_string())
        }
        Spec::LikedIntersection {
            playlist_id,
            genre,
            recipient,
            subject,
            ..
        } => {
            let liked = r.all_pages("music", "list_liked_songs", json!({}), "songs")?;
            let playlist = r.all_pages(
                "music",
                "show_playlist",
                json!({"playlist_id": playlist_id}),
                "songs",
            )?;
            let in_playlist: Vec<i64> = playlist
                .iter()
                .filter_map(|s| s["song_id"].as_i64())
                .collect();
            let titles: Vec<String> = liked
                .iter()
                .filter(|s| {
                    s["song_id"]
                        .as_i64()
                        .is_some_and(|id| in_playlist.contains(&id))
                })
                .filter(|s| genre.as_ref().is_none_or(|g| text(s, "genre") == *g))
                .map(|s| text(s, "title"))
                .collect();
            let list = titles.join(", ");
            if let (Some(to), Some(subject)) = (recipient, subject) {
                r.api(
                    "mail",
                    "send_email",
                    json!({"to": to, "subject": subject, "body": list}),
                )?;
            }
            r.complete(list)
        }
        Spec::PlaylistBuild {
            name,
            artist,
            genre,
            released_since,
        } => {
            let liked = r.all_pages("music", "list_liked_songs", json!({}), "songs")?;
            let mut picks = Vec::new();
            for song in liked.iter().filter(|s| text(s, "artist") == *artist) {
                if genre.as_ref().is_some_and(|g| text(song, "genre") != *g) {
                    continue;
                }
                if let Some(since) = released_since {
                    let detail =
                        r.api("music", "show_song", json!({"song_id": song["song_id"]}))?;
                    if date(&detail, "released").is_none_or(|d| d < *since) {
                        continue;
                    }
                }
                picks.push(song["song_id"].clone());
            }
            let created = r.api("music", "create_playlist", json!({"name": name}))?;
            let id = created["playlist_id"].clone();
            for song in &picks {
                r.api(
                    "music",
                    "add_song_to_playlist",
                    json!({"playlist_id": id, "song_id": song}),
                )?;
            }
            let back = r.all_pages(
                "music",
                "show_playlist",
                json!({"playlist_id": id}),
                "songs",
            )?;
            r.complete(back.len().to_string())
        }
        Spec::ReturnsWindow { keyword, period } => {
            let token = r.login("shopping")?;
            let returns = r.all_pages(
                "shopping",
                "list_returns",
                json!({"access_token": token}),
                "returns",
            )?;
            let (start, end) = window(*period, now);
            let keyword = keyword.to_lowercase();
            let total: i64 = returns
                .iter()
                .filter(|x| text(x, "product_name").to_lowercase().contains(&keyword))
                .filter(|x| date(x, "returned_at").is_some_and(|d| d >= start && d <= end))
                .map(|x| cents(x, "refund"))
                .sum();
            r.complete(dollars(total))
        }
        Spec::AccountRecovery {
            app,
            new_password,
            update_supervisor,
        } => {
            let profile = r.api("supervisor", "show_profile", json!({}))?;
            let email = profile["email"].clone();
            r.api(app, "send_password_reset_code", json!({"email": email}))?;
            // The code may be filtered into spam: look in both, take the newest code mail.
            let mut newest: Option<i64> = None;
            for folder in ["inbox", "spam"] {
                let page = r.api(
                    "mail",
                    "list_emails",
                    json!({"folder": folder, "page_size": r.page_size}),
                )?;
                for e in page["emails"].as_array().into_iter().flatten() {
                    if text(e, "from") == sender(app) {
                        let id = e["email_id"].as_i64().unwrap_or_default();
                        newest = newest.max(Some(id));
                    }
                }
            }
            let mail = r.api(
                "mail",
                "show_email",
                json!({"email_id": newest.unwrap_or_default()}),
            )?;
            let code = code_re()
                .find(&text(&mail, "body"))
                .map(|m| m.as_str().to_string())
                .unwrap_or_default();
            r.api(
                app,
                "reset_password",
                json!({"email": email, "code": code, "new_password": new_password}),
            )?;
            let login = r.api(
                app,
                "login",
                json!({"email": email, "password": new_password}),
            )?;
            let token = login["access_token"].clone();
            let answer = if app == "payments" {
                let balance = r.api("payments", "show_balance", json!({"access_token": token}))?;
                dollars(cents(&balance, "balance"))
            } else {
                let orders = r.api(
                    "shopping",
                    "list_orders",
                    json!({"access_token": token, "page_size": 1}),
                )?;
                orders["orders"][0]["order_id"]
                    .as_i64()
                    .unwrap_or_default()
                    .to_string()
            };
            if *update_supervisor {
                r.api(
                    "supervisor",
                    "update_account_password",
                    json!({"app": app, "password": new_password}),
                )?;
            }
            r.complete(answer)
        }
        Spec::TransferReadback { transfer, note } => {
            let token = r.login("payments")?;
            let payments: Vec<(String, i64)> = match transfer {
                TransferKind::Direct {
                    to_email,
                    amount_cents,
                    ..
                } => vec![(to_email.clone(), *amount_cents)],
                TransferKind::PayBack { name, days_ago } => {
                    let day = now.plus_days(-(*days_ago as i32));
                    let all = r.all_pages(
                        "payments",
                        "list_transactions",
                        json!({"access_token": token}),
                        "transactions",
                    )?;
                    all.iter()
                        .filter(|t| {
                            t["direction"] == "received"
                                && text(t, "counterparty_name") == *name
                                && date(t, "date") == Some(day)
                        })
                        .map(|t| (text(t, "counterparty"), cents(t, "amount")))
                        .collect()
                }
                TransferKind::PayBackWindow { days } => {
                    let start = now.plus_days(1 - *days as i32);
                    let all = r.all_pages(
                        "payments",
                        "list_transactions",
                        json!({"access_token": token}),
                        "transactions",
                    )?;
                    all.iter()
                        .filter(|t| {
                            t["direction"] == "received"
                                && date(t, "date").is_some_and(|d| d >= start && d <= now)
                        })
                        .map(|t| (text(t, "counterparty"), cents(t, "amount")))
                        .collect()
                }
            };
            for (to, amount) in &payments {
                r.api(
                    "payments",
                    "send_money",
                    json!({"access_token": token, "to_email": to, "amount": *amount as f64 / 100.0, "note": note}),
                )?;
            }
            // Fees make the new balance unknowable without reading it back.
            let balance = r.api("payments", "show_balance", json!({"access_token": token}))?;
            r.complete(dollars(cents(&balance, "balance")))
        }
    }
}

fn window(period: Period, now: Date) -> (Date, Date) {
    period.window(now)
}

fn code_re() -> &'static Regex {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"\b\d{6}\b").unwrap_or_else(|_| unreachable!("the pattern is valid"))
    })
}

fn today_re() -> &'static Regex {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"Today is \w+, (\d{4}-\d{2}-\d{2})")
            .unwrap_or_else(|_| unreachable!("the pattern is valid"))
    })
}

#[async_trait]
impl Policy for OraclePolicy {
    fn name(&self) -> &str {
        "appworld-oracle"
    }

    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let tool_messages: Vec<&str> = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .map(|m| m.content.as_str())
            .collect();
        let now = request
            .messages
            .iter()
            .find_map(|m| today_re().captures(&m.content))
            .and_then(|c| Date::parse(&c[1]))
            .unwrap_or(Date(0));
        let text = {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            // Only observations newer than those recorded are read, so elided old ones are fine.
            for content in tool_messages.iter().skip(seen.len()) {
                seen.push(
                    serde_json::from_str(content).unwrap_or(Value::String(content.to_string())),
                );
            }
            match &self.spec {
                None => {
                    "This task has no app-world spec, so the oracle cannot solve it.".to_string()
                }
                Some(spec) => {
                    let mut replay = Replay {
                        observations: &seen,
                        page_size: self.page_size,
                        next: 0,
                    };
                    match plan(spec, now, &mut replay) {
                        Err(call) => call.to_tool_call_block(),
                        Ok(_) => "The task is complete.".to_string(),
                    }
                }
            }
        };
        let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
        let logprobs = vec![0.0; tokens.len()];
        Ok(PolicyTurn {
            text,
            context_tokens: Vec::new(),
            tokens,
            logprobs,
            finish: FinishReason::Stop,
        })
    }
}
