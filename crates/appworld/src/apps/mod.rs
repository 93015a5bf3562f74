//! The apps' APIs: a documented registry, argument checking, and dispatch to each app.
//!
//! Every API is described once in [`APIS`]; the `api_docs` lookup tools render those
//! descriptions, and [`call`] checks a call's arguments against them before the app's handler
//! runs, so handlers only see well-typed arguments. Misuse is an error observation.

pub mod mail;
pub mod music;
pub mod payments;
pub mod shopping;
pub mod supervisor;

use std::collections::BTreeMap;

use harness_core::Observation;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value, json};

use super::world::World;

/// Default page size of paginated APIs.
pub const DEFAULT_PAGE_SIZE: usize = 5;
/// Largest page size a paginated API accepts.
pub const MAX_PAGE_SIZE: usize = 20;
/// Longest string argument accepted, in characters.
pub const MAX_STRING_CHARS: usize = 4000;

/// The type of an API parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    /// A JSON string.
    String,
    /// A JSON integer.
    Integer,
    /// A JSON number.
    Number,
}

impl Ty {
    fn json_name(self) -> &'static str {
        match self {
            Ty::String => "string",
            Ty::Integer => "integer",
            Ty::Number => "number",
        }
    }
}

/// One parameter of an API.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// Its name.
    pub name: &'static str,
    /// Its type.
    pub ty: Ty,
    /// Whether the call must give it.
    pub required: bool,
    /// What it means.
    pub description: &'static str,
}

const fn req(name: &'static str, ty: Ty, description: &'static str) -> Param {
    Param {
        name,
        ty,
        required: true,
        description,
    }
}

const fn opt(name: &'static str, ty: Ty, description: &'static str) -> Param {
    Param {
        name,
        ty,
        required: false,
        description,
    }
}

/// One API of an app.
#[derive(Debug, Clone, Copy)]
pub struct Api {
    /// The app it belongs to.
    pub app: &'static str,
    /// Its name within the app.
    pub name: &'static str,
    /// What it does.
    pub description: &'static str,
    /// Its own parameters (the access token and paging parameters are added by the flags).
    pub params: &'static [Param],
    /// It needs an `access_token` from the app's `login`.
    pub auth: bool,
    /// It returns one page of a listing and takes `page` and `page_size`.
    pub paginated: bool,
    /// What a successful call returns.
    pub returns: &'static str,
}

const TOKEN: Param = req(
    "access_token",
    Ty::String,
    "A token returned by this app's `login` API.",
);
const PAGE: Param = opt(
    "page",
    Ty::Integer,
    "Which page to return, from 1 (default 1).",
);
const PAGE_SIZE: Param = opt(
    "page_size",
    Ty::Integer,
    "Items per page, from 1 to 20 (default 5).",
);

impl Api {
    /// Every parameter the API takes, in documentation order.
    pub fn all_params(&self) -> Vec<Param> {
        let mut out = Vec::new();
        if self.auth {
            out.push(TOKEN);
        }
        out.extend_from_slice(self.params);
        if self.paginated {
            out.push(PAGE);
            out.push(PAGE_SIZE);
        }
        out
    }

    /// The API's documentation as JSON (what `api_docs_show_api` returns).
    pub fn doc(&self) -> Value {
        let params = self.all_params();
        let properties: Map<String, Value> = params
            .iter()
            .map(|p| {
                (
                    p.name.to_string(),
                    json!({"type": p.ty.json_name(), "description": p.description}),
                )
            })
            .collect();
        let required: Vec<&str> = params
            .iter()
            .filter(|p| p.required)
            .map(|p| p.name)
            .collect();
        json!({
            "app": self.app,
            "api": self.name,
            "description": self.description,
            "parameters": {"type": "object", "properties": properties, "required": required},
            "returns": self.returns,
        })
    }
}

/// The apps reachable through `call_api`, with one-line descriptions.
pub const APPS: &[(&str, &str)] = &[
    (
        "mail",
        "Email: inbox, spam, archive and sent folders; read and send messages.",
    ),
    (
        "music",
        "Music streaming: song library, liked songs, playlists.",
    ),
    (
        "payments",
        "Person-to-person payments: balance, transactions, sending money. Needs login.",
    ),
    (
        "shopping",
        "Online shop: past orders and product returns. Needs login.",
    ),
    (
        "supervisor",
        "The user you act for: their profile, saved app passwords, and task completion.",
    ),
];

/// The name of the supervisor API that ends a task (reached through the `complete_task` tool).
pub const COMPLETE_TASK: &str = "complete_task";

/// Every API of every app.
pub const APIS: &[Api] = &[
    // mail
    Api {
        app: "mail",
        name: "list_emails",
        description: "List the emails of one folder, newest first. Shows sender, subject and date, not the body.",
        params: &[req(
            "folder",
            Ty::String,
            "One of `inbox`, `spam`, `archive`, `sent`.",
        )],
        auth: false,
        paginated: true,
        returns: "{folder, page, page_size, emails: [{email_id, from_name, from, subject, date}]}",
    },
    Api {
        app: "mail",
        name: "show_email",
        description: "Show one email in full, body included.",
        params: &[req("email_id", Ty::Integer, "The email's id.")],
        auth: false,
        paginated: false,
        returns: "{email_id, folder, from_name, from, to, subject, date, body}",
    },
    Api {
        app: "mail",
        name: "send_email",
        description: "Send an email from the user's address. It is filed in `sent`.",
        params: &[
            req(
                "to",
                Ty::String,
                "Recipient addresses, separated by commas.",
            ),
            req("subject", Ty::String, "Subject line."),
            req("body", Ty::String, "Message text."),
        ],
        auth: false,
        paginated: false,
        returns: "{email_id, message}",
    },
    // music
    Api {
        app: "music",
        name: "list_library",
        description: "List the songs saved in the user's library.",
        params: &[],
        auth: false,
        paginated: true,
        returns: "{page, page_size, songs: [{song_id, title, artist, genre}]}",
    },
    Api {
        app: "music",
        name: "list_liked_songs",
        description: "List the songs the user liked, most recently liked first.",
        params: &[],
        auth: false,
        paginated: true,
        returns: "{page, page_size, songs: [{song_id, title, artist, genre}]}",
    },
    Api {
        app: "music",
        name: "list_playlists",
        description: "List the user's playlists.",
        params: &[],
        auth: false,
        paginated: true,
        returns: "{page, page_size, playlists: [{playlist_id, name, song_count}]}",
    },
    Api {
        app: "music",
        name: "show_playlist",
        description: "List the songs of one playlist, in playlist order.",
        params: &[req("playlist_id", Ty::Integer, "The playlist's id.")],
        auth: false,
        paginated: true,
        returns: "{playlist_id, name, page, page_size, songs: [{song_id, title, artist, genre}]}",
    },
    Api {
        app: "music",
        name: "show_song",
        description: "Show one song's details: duration, release date, whether it is liked or in the library.",
        params: &[req("song_id", Ty::Integer, "The song's id.")],
        auth: false,
        paginated: false,
        returns: "{song_id, title, artist, genre, duration_seconds, released, liked, in_library}",
    },
    Api {
        app: "music",
        name: "create_playlist",
        description: "Create an empty playlist.",
        params: &[req(
            "name",
            Ty::String,
            "The new playlist's name (must be unused).",
        )],
        auth: false,
        paginated: false,
        returns: "{playlist_id, message}",
    },
    Api {
        app: "music",
        name: "add_song_to_playlist",
        description: "Append a song to a playlist.",
        params: &[
            req("playlist_id", Ty::Integer, "The playlist's id."),
            req("song_id", Ty::Integer, "The song's id."),
        ],
        auth: false,
        paginated: false,
        returns: "{message}",
    },
    Api {
        app: "music",
        name: "remove_song_from_playlist",
        description: "Remove a song from a playlist.",
        params: &[
            req("playlist_id", Ty::Integer, "The playlist's id."),
            req("song_id", Ty::Integer, "The song's id."),
        ],
        auth: false,
        paginated: false,
        returns: "{message}",
    },
    Api {
        app: "music",
        name: "like_song",
        description: "Mark a song as liked.",
        params: &[req("song_id", Ty::Integer, "The song's id.")],
        auth: false,
        paginated: false,
        returns: "{message}",
    },
    Api {
        app: "music",
        name: "unlike_song",
        description: "Remove a song from the liked songs.",
        params: &[req("song_id", Ty::Integer, "The song's id.")],
        auth: false,
        paginated: false,
        returns: "{message}",
    },
    // payments
    Api {
        app: "payments",
        name: "login",
        description: "Log in and get an access token for the other payments APIs.",
        params: &[
            req("email", Ty::String, "The account's email address."),
            req("password", Ty::String, "The account's password."),
        ],
        auth: false,
        paginated: false,
        returns: "{access_token}",
    },
    Api {
        app: "payments",
        name: "send_password_reset_code",
        description: "Email a one-time password reset code to the account's address. A new code replaces every earlier one.",
        params: &[req("email", Ty::String, "The account's email address.")],
        auth: false,
        paginated: false,
        returns: "{message}",
    },
    Api {
        app: "payments",
        name: "reset_password",
        description: "Set a new password using the latest reset code.",
        params: &[
            req("email", Ty::String, "The account's email address."),
            req("code", Ty::String, "The reset code from the email."),
            req(
                "new_password",
                Ty::String,
                "The new password (at least 6 characters).",
            ),
        ],
        auth: false,
        paginated: false,
        returns: "{message}",
    },
    Api {
        app: "payments",
        name: "show_balance",
        description: "Show the account balance in dollars.",
        params: &[],
        auth: true,
        paginated: false,
        returns: "{balance}",
    },
    Api {
        app: "payments",
        name: "list_transactions",
        description: "List transactions, newest first. `amount` excludes service fees.",
        params: &[],
        auth: true,
        paginated: true,
        returns: "{page, page_size, transactions: [{transaction_id, date, direction, counterparty_name, counterparty, amount, note}]}",
    },
    Api {
        app: "payments",
        name: "show_transaction",
        description: "Show one transaction, its service fee included.",
        params: &[req("transaction_id", Ty::Integer, "The transaction's id.")],
        auth: true,
        paginated: false,
        returns: "{transaction_id, date, direction, counterparty_name, counterparty, amount, fee, note}",
    },
    Api {
        app: "payments",
        name: "send_money",
        description: "Send money to someone by email address. A service fee may be charged on top of the amount.",
        params: &[
            req("to_email", Ty::String, "The recipient's email address."),
            req(
                "amount",
                Ty::Number,
                "Dollars to send (more than 0, at most two decimals).",
            ),
            opt("note", Ty::String, "A note shown to the recipient."),
        ],
        auth: true,
        paginated: false,
        returns: "{transaction_id, message}",
    },
    // shopping
    Api {
        app: "shopping",
        name: "login",
        description: "Log in and get an access token for the other shopping APIs.",
        params: &[
            req("email", Ty::String, "The account's email address."),
            req("password", Ty::String, "The account's password."),
        ],
        auth: false,
        paginated: false,
        returns: "{access_token}",
    },
    Api {
        app: "shopping",
        name: "send_password_reset_code",
        description: "Email a one-time password reset code to the account's address. A new code replaces every earlier one.",
        params: &[req("email", Ty::String, "The account's email address.")],
        auth: false,
        paginated: false,
        returns: "{message}",
    },
    Api {
        app: "shopping",
        name: "reset_password",
        description: "Set a new password using the latest reset code.",
        params: &[
            req("email", Ty::String, "The account's email address."),
            req("code", Ty::String, "The reset code from the email."),
            req(
                "new_password",
                Ty::String,
                "The new password (at least 6 characters).",
            ),
        ],
        auth: false,
        paginated: false,
        returns: "{message}",
    },
    Api {
        app: "shopping",
        name: "list_orders",
        description: "List orders, newest first.",
        params: &[],
        auth: true,
        paginated: true,
        returns: "{page, page_size, orders: [{order_id, date, total, items: [{product_name, quantity, price}]}]}",
    },
    Api {
        app: "shopping",
        name: "show_order",
        description: "Show one order.",
        params: &[req("order_id", Ty::Integer, "The order's id.")],
        auth: true,
        paginated: false,
        returns: "{order_id, date, total, items: [{product_name, quantity, price}]}",
    },
    Api {
        app: "shopping",
        name: "list_returns",
        description: "List product returns, most recently returned first.",
        params: &[],
        auth: true,
        paginated: true,
        returns: "{page, page_size, returns: [{return_id, order_id, product_name, returned_at, refund}]}",
    },
    // supervisor
    Api {
        app: "supervisor",
        name: "show_profile",
        description: "Show the user's name, email and phone.",
        params: &[],
        auth: false,
        paginated: false,
        returns: "{first_name, last_name, email, phone}",
    },
    Api {
        app: "supervisor",
        name: "show_account_passwords",
        description: "Show the passwords the user saved for their app accounts.",
        params: &[],
        auth: false,
        paginated: false,
        returns: "{passwords: [{app, password}]}",
    },
    Api {
        app: "supervisor",
        name: "update_account_password",
        description: "Change the password saved for an app (does not change the app account itself).",
        params: &[
            req("app", Ty::String, "The app's name."),
            req("password", Ty::String, "The password to save."),
        ],
        auth: false,
        paginated: false,
        returns: "{message}",
    },
    Api {
        app: "supervisor",
        name: COMPLETE_TASK,
        description: "Finish the task, giving the answer when the task asks a question. Call it through the `complete_task` tool, not `call_api`; it ends the episode.",
        params: &[opt(
            "answer",
            Ty::String,
            "The answer, or empty when the task asks for none.",
        )],
        auth: false,
        paginated: false,
        returns: "{message}",
    },
];

/// The API `app.name`, if it exists.
pub fn find_api(app: &str, name: &str) -> Option<&'static Api> {
    APIS.iter().find(|a| a.app == app && a.name == name)
}

/// Per-episode state that is not part of the world: login tokens and pending reset codes.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// Access tokens handed out, with the app each is good for.
    pub tokens: BTreeMap<String, String>,
    /// The latest reset code of each app.
    pub codes: BTreeMap<String, String>,
    /// Draws tokens and codes (seeded by the episode seed).
    pub rng: ChaCha8Rng,
}

impl Runtime {
    /// A fresh token for `app`.
    pub fn new_token(&mut self, app: &str) -> String {
        let token = format!("{app}-{:012x}", self.rng.r#gen::<u64>() & 0xffff_ffff_ffff);
        self.tokens.insert(token.clone(), app.to_string());
        token
    }

    /// A fresh six-digit code for `app`, replacing any earlier one.
    pub fn new_code(&mut self, app: &str) -> String {
        let code = format!("{:06}", self.rng.gen_range(0..1_000_000u32));
        self.codes.insert(app.to_string(), code.clone());
        code
    }
}

/// Checked arguments of one call.
#[derive(Debug)]
pub struct Args<'a> {
    map: &'a Map<String, Value>,
}

impl Args<'_> {
    /// A string argument (empty when absent).
    pub fn str(&self, name: &str) -> &str {
        self.map.get(name).and_then(Value::as_str).unwrap_or("")
    }

    /// An integer argument.
    pub fn int(&self, name: &str) -> Option<i64> {
        self.map.get(name).and_then(Value::as_i64)
    }

    /// A number argument.
    pub fn num(&self, name: &str) -> Option<f64> {
        self.map.get(name).and_then(Value::as_f64)
    }

    /// An id argument (a non-negative integer that fits an id).
    pub fn id(&self, name: &str) -> Option<u32> {
        self.int(name).and_then(|v| u32::try_from(v).ok())
    }
}

/// What a handler answers: a JSON result or an error message.
pub type Reply = Result<Value, String>;

/// One page of a listing: `(page, page_size)` from the arguments, validated.
pub fn page_args(args: &Args<'_>) -> Result<(usize, usize), String> {
    let page = args.int("page").unwrap_or(1);
    let size = args.int("page_size").unwrap_or(DEFAULT_PAGE_SIZE as i64);
    if page < 1 {
        return Err(format!("`page` must be at least 1, got {page}."));
    }
    if !(1..=MAX_PAGE_SIZE as i64).contains(&size) {
        return Err(format!(
            "`page_size` must be from 1 to {MAX_PAGE_SIZE}, got {size}."
        ));
    }
    Ok((page as usize, size as usize))
}

/// A page of `items` and whether the listing has more than one page (so this page is one of
/// several and the caller should look at the others).
pub fn paginate<T: Clone>(items: &[T], page: usize, size: usize) -> (Vec<T>, bool) {
    let start = (page - 1).saturating_mul(size);
    let chunk: Vec<T> = items.iter().skip(start).take(size).cloned().collect();
    let multi = items.len() > size && start < items.len();
    (chunk, multi)
}

fn check_args<'a>(api: &Api, arguments: &'a Value) -> Result<Args<'a>, String> {
    let map = match arguments {
        Value::Object(map) => map,
        Value::Null => {
            static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
            EMPTY.get_or_init(Map::new)
        }
        _ => return Err("`arguments` must be a JSON object.".into()),
    };
    let params = api.all_params();
    for key in map.keys() {
        if !params.iter().any(|p| p.name == key) {
            let names: Vec<&str> = params.iter().map(|p| p.name).collect();
            return Err(format!(
                "`{}.{}` has no parameter `{}`; it takes: {}.",
                api.app,
                api.name,
                truncate(key, 60),
                if names.is_empty() {
                    "no parameters".to_string()
                } else {
                    names.join(", ")
                }
            ));
        }
    }
    for p in &params {
        let Some(value) = map.get(p.name) else {
            if p.required {
                return Err(format!(
                    "`{}.{}` needs the parameter `{}` ({}).",
                    api.app,
                    api.name,
                    p.name,
                    p.ty.json_name()
                ));
            }
            continue;
        };
        let ok = match p.ty {
            Ty::String => value
                .as_str()
                .is_some_and(|s| s.chars().count() <= MAX_STRING_CHARS),
            Ty::Integer => value.as_i64().is_some(),
            Ty::Number => value.as_f64().is_some_and(f64::is_finite),
        };
        if !ok {
            let what = if value.is_string() && p.ty == Ty::String {
                format!("a string of at most {MAX_STRING_CHARS} characters")
            } else {
                format!("a {}", p.ty.json_name())
            };
            return Err(format!(
                "The parameter `{}` of `{}.{}` must be {what}.",
                p.name, api.app, api.name
            ));
        }
    }
    Ok(Args { map })
}

/// Cut a string for an error message.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let kept: String = text.chars().take(max).collect();
        format!("{kept}...")
    }
}

/// Check the token of an authenticated call.
fn check_token(api: &Api, args: &Args<'_>, rt: &Runtime) -> Result<(), String> {
    let token = args.str("access_token");
    match rt.tokens.get(token) {
        Some(app) if app == api.app => Ok(()),
        Some(app) => Err(format!(
            "This access token is for `{app}`, not `{}`. Log in to `{}` first.",
            api.app, api.app
        )),
        None => Err(format!(
            "Invalid access token. Get one from `{}.login`.",
            api.app
        )),
    }
}

/// Call `app.api` with `arguments` on the world.
pub fn call(
    world: &mut World,
    rt: &mut Runtime,
    app: &str,
    api: &str,
    arguments: &Value,
) -> Observation {
    let Some(spec) = find_api(app, api) else {
        if !APPS.iter().any(|(name, _)| *name == app) {
            let names: Vec<&str> = APPS.iter().map(|(n, _)| *n).collect();
            let hint = if app == "api_docs" {
                " Use the `api_docs_*` tools to read the documentation."
            } else {
                ""
            };
            return Observation::error(format!(
                "Unknown app `{}`. Apps: {}.{hint}",
                truncate(app, 60),
                names.join(", ")
            ));
        }
        return Observation::error(format!(
            "The app `{app}` has no API `{}`. Use `api_docs_list_apis` to see its APIs.",
            truncate(api, 60)
        ));
    };
    if spec.name == COMPLETE_TASK {
        return Observation::error(
            "Call `complete_task` through the `complete_task` tool, not through `call_api`.",
        );
    }
    let args = match check_args(spec, arguments) {
        Ok(args) => args,
        Err(e) => return Observation::error(e),
    };
    if spec.auth
        && let Err(e) = check_token(spec, &args, rt)
    {
        return Observation::error(e);
    }
    let paging = if spec.paginated {
        match page_args(&args) {
            Ok(p) => Some(p),
            Err(e) => return Observation::error(e),
        }
    } else {
        None
    };
    let mut multi_page = false;
    let reply = match app {
        "mail" => mail::call(world, spec.name, &args, paging, &mut multi_page),
        "music" => music::call(world, spec.name, &args, paging, &mut multi_page),
        "payments" => payments::call(world, rt, spec.name, &args, paging, &mut multi_page),
        "shopping" => shopping::call(world, rt, spec.name, &args, paging, &mut multi_page),
        "supervisor" => supervisor::call(world, spec.name, &args),
        _ => Err(format!("Unknown app `{app}`.")),
    };
    match reply {
        Ok(value) => {
            let obs = Observation::ok(value.to_string());
            if multi_page { obs.paginated() } else { obs }
        }
        Err(e) => Observation::error(e),
    }
}

/// Dollars from cents, as a JSON number with two decimals at most.
pub fn dollars(cents: i64) -> Value {
    json!((cents as f64) / 100.0)
}

/// Cents from a dollar amount with at most two decimals.
pub fn cents(amount: f64) -> Option<i64> {
    let scaled = amount * 100.0;
    let rounded = scaled.round();
    ((scaled - rounded).abs() < 1e-6 && rounded.abs() < 1e12).then_some(rounded as i64)
}

/// Shared by payments and shopping: login, reset codes and password resets of an account.
pub mod account {
    use super::super::world::{Email, Folder, World};
    use super::{Args, Reply, Runtime};
    use serde_json::json;

    /// The no-reply address an app sends codes from.
    pub fn sender(app: &str) -> String {
        format!("no-reply@{app}.example.com")
    }

    fn account_mut<'w>(world: &'w mut World, app: &str) -> &'w mut super::super::world::Account {
        if app == "payments" {
            &mut world.payments.account
        } else {
            &mut world.shopping.account
        }
    }

    /// `login`, `send_password_reset_code`, `reset_password`; `None` for other APIs.
    pub fn call(
        world: &mut World,
        rt: &mut Runtime,
        app: &str,
        api: &str,
        args: &Args<'_>,
    ) -> Option<Reply> {
        let email = args.str("email").trim().to_string();
        let reply = match api {
            "login" => {
                let account = account_mut(world, app);
                if !account.email.eq_ignore_ascii_case(&email) {
                    Err(format!(
                        "No {app} account uses the email `{}`.",
                        super::truncate(&email, 80)
                    ))
                } else if account.password != args.str("password") {
                    Err("Wrong password.".to_string())
                } else {
                    Ok(json!({"access_token": rt.new_token(app)}))
                }
            }
            "send_password_reset_code" => {
                let account = account_mut(world, app);
                if !account.email.eq_ignore_ascii_case(&email) {
                    Err(format!(
                        "No {app} account uses the email `{}`.",
                        super::truncate(&email, 80)
                    ))
                } else {
                    let address = account.email.clone();
                    let code = rt.new_code(app);
                    let folder = if world.mail.spam_senders.contains(&sender(app)) {
                        Folder::Spam
                    } else {
                        Folder::Inbox
                    };
                    let id = world.next_email_id();
                    let title = capitalise(app);
                    world.mail.emails.insert(
                        id,
                        Email {
                            folder,
                            from_name: format!("{title} Security"),
                            from: sender(app),
                            to: vec![address.clone()],
                            subject: format!("Your {title} password reset code"),
                            body: format!(
                                "Someone asked to reset the password of your {title} account. Your reset code is {code}. It replaces any code sent before."
                            ),
                            date: world.now,
                        },
                    );
                    Ok(json!({"message": format!("A reset code was emailed to {address}.")}))
                }
            }
            "reset_password" => {
                let new_password = args.str("new_password").to_string();
                let valid_code = rt.codes.get(app).cloned();
                let account = account_mut(world, app);
                if !account.email.eq_ignore_ascii_case(&email) {
                    Err(format!(
                        "No {app} account uses the email `{}`.",
                        super::truncate(&email, 80)
                    ))
                } else if valid_code.as_deref() != Some(args.str("code").trim()) {
                    Err("The reset code is wrong or expired. Only the most recently requested code works.".to_string())
                } else if new_password.chars().count() < 6 {
                    Err("The new password must have at least 6 characters.".to_string())
                } else {
                    account.password = new_password;
                    rt.codes.remove(app);
                    Ok(json!({"message": "Password changed."}))
                }
            }
            _ => return None,
        };
        Some(reply)
    }

    /// "payments" -> "Payments".
    pub fn capitalise(word: &str) -> String {
        let mut chars = word.chars();
        match chars.next() {
            Some(first) => first.to_uppercase().chain(chars).collect(),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Gen, base_world};
    use rand::SeedableRng;

    fn setup() -> (World, Runtime) {
        let world = base_world(&mut Gen::new(4));
        let runtime = Runtime {
            tokens: BTreeMap::new(),
            codes: BTreeMap::new(),
            rng: ChaCha8Rng::seed_from_u64(1),
        };
        (world, runtime)
    }

    fn ok(obs: &Observation) -> Value {
        assert!(!obs.error, "{}", obs.text);
        serde_json::from_str(&obs.text).expect("JSON result")
    }

    #[test]
    fn arguments_are_checked_against_the_documentation() {
        let (mut w, mut rt) = setup();
        let mut call = |api: &str, args: Value| super::call(&mut w, &mut rt, "mail", api, &args);
        assert!(
            call("list_emails", json!({}))
                .text
                .contains("needs the parameter `folder`")
        );
        assert!(
            call("list_emails", json!({"folder": 3}))
                .text
                .contains("must be a string")
        );
        assert!(
            call("list_emails", json!({"folder": "inbox", "colour": 1}))
                .text
                .contains("no parameter `colour`")
        );
        assert!(
            call(
                "list_emails",
                json!({"folder": "x".repeat(MAX_STRING_CHARS + 1)})
            )
            .error
        );
        assert!(call("list_emails", json!({"folder": "inbox", "page_size": 21})).error);
        assert!(
            call("list_emails", json!({"folder": "attic"}))
                .text
                .contains("Unknown folder")
        );
        assert!(
            call("show_email", json!({"email_id": -3}))
                .text
                .contains("No email")
        );
        let page = ok(&call(
            "list_emails",
            json!({"folder": "inbox", "page_size": 2}),
        ));
        assert_eq!(page["emails"].as_array().map(Vec::len), Some(2));
        let obs = super::call(&mut w, &mut rt, "supervisor", "complete_task", &json!({}));
        assert!(obs.error && obs.text.contains("complete_task` tool"));
        let obs = super::call(&mut w, &mut rt, "mall", "x", &json!({}));
        assert!(obs.error && obs.text.contains("Unknown app"));
    }

    #[test]
    fn tokens_belong_to_one_app_and_fees_are_charged() {
        let (mut w, mut rt) = setup();
        let email = w.user().email.clone();
        let password = w.payments.account.password.clone();
        let login = ok(&call(
            &mut w,
            &mut rt,
            "payments",
            "login",
            &json!({"email": email, "password": password}),
        ));
        let token = login["access_token"].clone();
        let wrong = call(
            &mut w,
            &mut rt,
            "shopping",
            "list_orders",
            &json!({"access_token": token}),
        );
        assert!(wrong.error && wrong.text.contains("not `shopping`"));
        let bad = call(
            &mut w,
            &mut rt,
            "payments",
            "login",
            &json!({"email": email, "password": "nope"}),
        );
        assert!(bad.error);
        let before = w.payments.balance_cents;
        let to = w.contacts[0].email.clone();
        let sent = call(
            &mut w,
            &mut rt,
            "payments",
            "send_money",
            &json!({"access_token": token, "to_email": to, "amount": 10.0}),
        );
        ok(&sent);
        let fee = payments::fee(1000, w.payments.fee_bps);
        assert!(fee > 0);
        assert_eq!(w.payments.balance_cents, before - 1000 - fee);
        for amount in [json!(0), json!(-5), json!(0.001), json!(1e15)] {
            let obs = call(
                &mut w,
                &mut rt,
                "payments",
                "send_money",
                &json!({"access_token": token, "to_email": to, "amount": amount}),
            );
            assert!(obs.error, "{amount}");
        }
        let me = call(
            &mut w,
            &mut rt,
            "payments",
            "send_money",
            &json!({"access_token": token, "to_email": email, "amount": 1}),
        );
        assert!(me.error);
    }

    #[test]
    fn only_the_latest_reset_code_works() {
        let (mut w, mut rt) = setup();
        let email = w.user().email.clone();
        let mails_before = w.mail.emails.len();
        for _ in 0..2 {
            ok(&call(
                &mut w,
                &mut rt,
                "shopping",
                "send_password_reset_code",
                &json!({"email": email}),
            ));
        }
        assert_eq!(w.mail.emails.len(), mails_before + 2);
        let codes: Vec<String> = w
            .mail
            .emails
            .values()
            .filter(|e| e.from == account::sender("shopping"))
            .map(|e| e.body.chars().filter(char::is_ascii_digit).collect())
            .collect();
        assert_eq!(codes.len(), 2);
        let reset = |w: &mut World, rt: &mut Runtime, code: &str, password: &str| {
            call(
                w,
                rt,
                "shopping",
                "reset_password",
                &json!({"email": email, "code": code, "new_password": password}),
            )
        };
        if codes[0] != codes[1] {
            assert!(reset(&mut w, &mut rt, &codes[0], "brand-new-1").error);
        }
        assert!(reset(&mut w, &mut rt, &codes[1], "short").error);
        ok(&reset(&mut w, &mut rt, &codes[1], "brand-new-1"));
        assert_eq!(w.shopping.account.password, "brand-new-1");
        // A code works once.
        assert!(reset(&mut w, &mut rt, &codes[1], "brand-new-2").error);
    }

    #[test]
    fn pages_say_whether_the_listing_has_several() {
        let items: Vec<u32> = (0..12).collect();
        assert_eq!(paginate(&items, 1, 5), (vec![0, 1, 2, 3, 4], true));
        assert_eq!(paginate(&items, 3, 5), (vec![10, 11], true));
        assert_eq!(paginate(&items, 4, 5), (vec![], false));
        assert_eq!(paginate(&items, 1, 20), (items.clone(), false));
        assert_eq!(paginate(&items, usize::MAX, 20), (vec![], false));
        for api in APIS {
            let doc = api.doc();
            assert_eq!(doc["parameters"]["type"], "object");
            assert_eq!(
                api.paginated,
                doc["parameters"]["properties"].get("page_size").is_some()
            );
        }
    }
}
