//! The mail app: folders, reading and sending.

use serde_json::{Value, json};

use super::super::world::{Email, Folder, World};
use super::{Args, Reply, paginate};

/// The summary of an email shown in listings.
fn summary(id: u32, email: &Email) -> Value {
    json!({
        "email_id": id,
        "from_name": email.from_name,
        "from": email.from,
        "subject": email.subject,
        "date": email.date,
    })
}

/// The emails of a folder, newest first (ties: higher id first).
pub fn folder_listing(world: &World, folder: Folder) -> Vec<(u32, &Email)> {
    let mut items: Vec<(u32, &Email)> = world
        .mail
        .emails
        .iter()
        .filter(|(_, e)| e.folder == folder)
        .map(|(id, e)| (*id, e))
        .collect();
    items.sort_by(|a, b| b.1.date.cmp(&a.1.date).then(b.0.cmp(&a.0)));
    items
}

pub(super) fn call(
    world: &mut World,
    api: &str,
    args: &Args<'_>,
    paging: Option<(usize, usize)>,
    multi_page: &mut bool,
) -> Reply {
    match api {
        "list_emails" => {
            let name = args.str("folder");
            let folder = Folder::parse(name).ok_or_else(|| {
                format!(
                    "Unknown folder `{}`; expected inbox, spam, archive or sent.",
                    super::truncate(name, 40)
                )
            })?;
            let (page, size) = paging.unwrap_or((1, super::DEFAULT_PAGE_SIZE));
            let all: Vec<Value> = folder_listing(world, folder)
                .into_iter()
                .map(|(id, e)| summary(id, e))
                .collect();
            let (items, multi) = paginate(&all, page, size);
            *multi_page = multi;
            Ok(json!({"folder": folder.as_str(), "page": page, "page_size": size, "emails": items}))
        }
        "show_email" => {
            let id = args.id("email_id");
            let email = id
                .and_then(|id| world.mail.emails.get(&id))
                .ok_or_else(|| {
                    format!("No email with id {}.", args.int("email_id").unwrap_or(-1))
                })?;
            Ok(json!({
                "email_id": id,
                "folder": email.folder.as_str(),
                "from_name": email.from_name,
                "from": email.from,
                "to": email.to,
                "subject": email.subject,
                "date": email.date,
                "body": email.body,
            }))
        }
        "send_email" => {
            let to: Vec<String> = args
                .str("to")
                .split([',', ';'])
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            if to.is_empty() {
                return Err("`to` must name at least one address.".into());
            }
            if let Some(bad) = to.iter().find(|a| !is_address(a)) {
                return Err(format!(
                    "`{}` is not an email address.",
                    super::truncate(bad, 80)
                ));
            }
            let subject = args.str("subject").trim().to_string();
            if subject.is_empty() {
                return Err("`subject` must not be empty.".into());
            }
            let user = world.user().clone();
            let id = world.next_email_id();
            world.mail.emails.insert(
                id,
                Email {
                    folder: Folder::Sent,
                    from_name: user.full_name(),
                    from: user.email,
                    to,
                    subject,
                    body: args.str("body").to_string(),
                    date: world.now,
                },
            );
            Ok(json!({"email_id": id, "message": "Email sent."}))
        }
        _ => Err(format!("The app `mail` has no API `{api}`.")),
    }
}

/// A plausible address: `local@domain.tld` without spaces.
pub fn is_address(text: &str) -> bool {
    let Some((local, domain)) = text.split_once('@') else {
        return false;
    };
    !local.is_empty()
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !text.contains(char::is_whitespace)
        && text.len() <= 200
}
