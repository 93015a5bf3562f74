//! The state of the app world: every app's data, as plain serde structs.
//!
//! The whole world serialises to one JSON value; the verifier compares the value before and
//! after an episode ([`diff`]) to find collateral damage. Collections are maps keyed by id so a
//! change shows up at a stable path (`mail.emails.17.folder`) rather than as shifted indices.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::date::Date;

/// A person: the user or one of their contacts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Person {
    /// Given name.
    pub first_name: String,
    /// Family name.
    pub last_name: String,
    /// Email address (also the login of every app account).
    pub email: String,
    /// Phone number.
    pub phone: String,
}

impl Person {
    /// "First Last".
    pub fn full_name(&self) -> String {
        format!("{} {}", self.first_name, self.last_name)
    }
}

/// A mail folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Folder {
    /// Incoming mail.
    Inbox,
    /// Mail the filter flagged.
    Spam,
    /// Mail the user filed away.
    Archive,
    /// Mail the user sent.
    Sent,
}

impl Folder {
    /// Every folder.
    pub const ALL: [Folder; 4] = [Folder::Inbox, Folder::Spam, Folder::Archive, Folder::Sent];

    /// The lowercase name used in API arguments.
    pub fn as_str(self) -> &'static str {
        match self {
            Folder::Inbox => "inbox",
            Folder::Spam => "spam",
            Folder::Archive => "archive",
            Folder::Sent => "sent",
        }
    }

    /// Parse a folder name.
    pub fn parse(name: &str) -> Option<Folder> {
        Folder::ALL
            .into_iter()
            .find(|f| f.as_str().eq_ignore_ascii_case(name.trim()))
    }
}

/// One email.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Email {
    /// Where it is filed.
    pub folder: Folder,
    /// The sender's display name.
    pub from_name: String,
    /// The sender's address.
    pub from: String,
    /// The recipients' addresses.
    pub to: Vec<String>,
    /// Subject line.
    pub subject: String,
    /// Body text.
    pub body: String,
    /// The day it was sent.
    pub date: Date,
}

/// The mail app.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MailApp {
    /// Every email by id.
    pub emails: BTreeMap<u32, Email>,
    /// New mail from these addresses is filed in `spam`.
    pub spam_senders: BTreeSet<String>,
}

/// A song in the music catalogue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Song {
    /// Title.
    pub title: String,
    /// Performing artist.
    pub artist: String,
    /// Genre.
    pub genre: String,
    /// Length in seconds.
    pub duration_s: u32,
    /// Release day.
    pub released: Date,
}

/// A playlist.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Playlist {
    /// Its name.
    pub name: String,
    /// Its songs, in order.
    pub song_ids: Vec<u32>,
}

/// The music app.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MusicApp {
    /// The catalogue by id.
    pub songs: BTreeMap<u32, Song>,
    /// Songs saved to the user's library (sorted by id).
    pub library: Vec<u32>,
    /// Songs the user liked, most recent first.
    pub liked: Vec<u32>,
    /// The user's playlists by id.
    pub playlists: BTreeMap<u32, Playlist>,
}

/// Credentials of an app account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Account {
    /// The login (the user's email).
    pub email: String,
    /// The current password.
    pub password: String,
}

/// Direction of a payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Money came in.
    Received,
    /// Money went out.
    Sent,
}

/// A payment transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transaction {
    /// The day it happened.
    pub date: Date,
    /// The other party's email.
    pub counterparty: String,
    /// The other party's name.
    pub counterparty_name: String,
    /// Amount in cents (always positive).
    pub amount_cents: i64,
    /// Service fee in cents charged to the user (sent payments only).
    pub fee_cents: i64,
    /// Received or sent.
    pub direction: Direction,
    /// The payment note.
    pub note: String,
}

/// The payments app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaymentsApp {
    /// Login credentials.
    pub account: Account,
    /// Balance in cents.
    pub balance_cents: i64,
    /// Service fee on sent payments, in basis points of the amount.
    pub fee_bps: i64,
    /// Transactions by id.
    pub transactions: BTreeMap<u32, Transaction>,
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderItem {
    /// Product name.
    pub product_name: String,
    /// Units bought.
    pub quantity: u32,
    /// Price per unit in cents.
    pub price_cents: i64,
}

/// A shopping order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    /// The day it was placed.
    pub date: Date,
    /// What was bought.
    pub items: Vec<OrderItem>,
}

/// A returned product.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Return {
    /// The order it came from.
    pub order_id: u32,
    /// The product returned.
    pub product_name: String,
    /// The day it was returned.
    pub returned_at: Date,
    /// Refund in cents.
    pub refund_cents: i64,
}

/// The shopping app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShoppingApp {
    /// Login credentials.
    pub account: Account,
    /// Orders by id.
    pub orders: BTreeMap<u32, Order>,
    /// Returns by id.
    pub returns: BTreeMap<u32, Return>,
}

/// The supervisor app: who the user is and the passwords they keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SupervisorApp {
    /// The user's profile.
    pub profile: Person,
    /// Saved passwords by app name.
    pub passwords: BTreeMap<String, String>,
}

/// Everything in the world.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct World {
    /// "Today" for this task.
    pub now: Date,
    /// The user's contacts.
    pub contacts: Vec<Person>,
    /// Mail.
    pub mail: MailApp,
    /// Music.
    pub music: MusicApp,
    /// Payments.
    pub payments: PaymentsApp,
    /// Shopping.
    pub shopping: ShoppingApp,
    /// Supervisor.
    pub supervisor: SupervisorApp,
}

impl World {
    /// The world as one JSON value (the snapshot the verifier compares).
    pub fn snapshot(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| unreachable!("world state is plain data"))
    }

    /// The user.
    pub fn user(&self) -> &Person {
        &self.supervisor.profile
    }

    /// The next free email id.
    pub fn next_email_id(&self) -> u32 {
        self.mail.emails.keys().next_back().map_or(1, |k| k + 1)
    }

    /// A contact's display name for an address, when the address is known.
    pub fn name_of(&self, email: &str) -> Option<String> {
        self.contacts
            .iter()
            .chain(std::iter::once(&self.supervisor.profile))
            .find(|p| p.email.eq_ignore_ascii_case(email))
            .map(Person::full_name)
    }
}

/// One difference between two snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "change", content = "path", rename_all = "lowercase")]
pub enum Change {
    /// A value exists only after.
    Added(String),
    /// A value exists only before.
    Removed(String),
    /// A value differs.
    Changed(String),
}

impl Change {
    /// The dotted path of the value.
    pub fn path(&self) -> &str {
        match self {
            Change::Added(p) | Change::Removed(p) | Change::Changed(p) => p,
        }
    }
}

/// Every difference between `before` and `after`, at the deepest path where they differ.
/// Arrays of different lengths differ as a whole (their order carries meaning).
pub fn diff(before: &Value, after: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    diff_into("", before, after, &mut out);
    out
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn diff_into(path: &str, before: &Value, after: &Value, out: &mut Vec<Change>) {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, va) in a {
                match b.get(key) {
                    Some(vb) => diff_into(&join(path, key), va, vb, out),
                    None => out.push(Change::Removed(join(path, key))),
                }
            }
            for key in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(Change::Added(join(path, key)));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                diff_into(&join(path, &i.to_string()), va, vb, out);
            }
        }
        _ if before == after => {}
        _ => out.push(Change::Changed(path.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diff_reports_deepest_paths() {
        let a = json!({"mail": {"emails": {"1": {"folder": "inbox"}, "2": {"folder": "spam"}}}, "l": [1, 2]});
        let b = json!({"mail": {"emails": {"1": {"folder": "archive"}, "3": {"folder": "sent"}}}, "l": [1, 2, 3]});
        assert_eq!(
            diff(&a, &b),
            vec![
                Change::Changed("l".into()),
                Change::Changed("mail.emails.1.folder".into()),
                Change::Removed("mail.emails.2".into()),
                Change::Added("mail.emails.3".into()),
            ]
        );
        assert!(diff(&a, &a).is_empty());
    }
}
