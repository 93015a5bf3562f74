//! Task templates: seeded generation of a world plus a request, and the state-based verifier.
//!
//! Each template targets one behaviour the paper's sibling harnesses repair (Table 7 and
//! Table 4): paginating through every page and every source, intersecting conditions rather
//! than taking a union, filtering by dates relative to "now", multi-step account recovery,
//! reading back after a write, and submitting through `complete_task`. Difficulty 1 to 3 adds
//! pages, sources, distractors and steps.
//!
//! A [`Spec`] holds only what the request says. The ground truth is computed from the initial
//! world by [`expected`], and [`verify`] checks the answer, the intended final state and that
//! nothing else changed.

use std::collections::BTreeSet;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::apps::account::{capitalise, sender};
use super::apps::{mail, shopping};
use super::date::Date;
use super::generate::{self as g, GENRES, Gen, KEYWORDS};
use super::world::{Change, Direction, Folder, Transaction, World, diff};

/// The task templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Template {
    /// Count a sender's emails across several folders (pagination across sources).
    MailCount,
    /// Songs that are liked *and* in a playlist (*and* of a genre): intersection, not union.
    LikedIntersection,
    /// Build a playlist from liked songs matching several conditions, then read it back.
    PlaylistBuild,
    /// Total refund of one kind of product returned in a period relative to today.
    ReturnsWindow,
    /// Reset a password with an emailed code, log in, and answer from the account.
    AccountRecovery,
    /// Send money, then report the balance (a fee makes reading it back necessary).
    TransferReadback,
}

impl Template {
    /// Every template, in generation order.
    pub const ALL: [Template; 6] = [
        Template::MailCount,
        Template::LikedIntersection,
        Template::PlaylistBuild,
        Template::ReturnsWindow,
        Template::AccountRecovery,
        Template::TransferReadback,
    ];

    /// The snake-case name used in task ids and metadata.
    pub fn as_str(self) -> &'static str {
        match self {
            Template::MailCount => "mail_count",
            Template::LikedIntersection => "liked_intersection",
            Template::PlaylistBuild => "playlist_build",
            Template::ReturnsWindow => "returns_window",
            Template::AccountRecovery => "account_recovery",
            Template::TransferReadback => "transfer_readback",
        }
    }

    /// Parse a template name.
    pub fn parse(name: &str) -> Option<Template> {
        Template::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// The behaviour the template needs, in a few words.
    pub fn behaviour(self) -> &'static str {
        match self {
            Template::MailCount => "paginate through every page of every requested folder",
            Template::LikedIntersection => "intersect the conditions instead of taking a union",
            Template::PlaylistBuild => "filter jointly, write, and read the result back",
            Template::ReturnsWindow => "filter by product and by a date window relative to today",
            Template::AccountRecovery => "request a code, read it from mail, reset, log in",
            Template::TransferReadback => "write, then read the balance back before answering",
        }
    }
}

/// A date window relative to today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    /// From the first of the current month to today.
    ThisMonth,
    /// The whole previous calendar month.
    LastMonth,
    /// The last `n` days, today included.
    PastDays(u32),
}

impl Period {
    /// The first and last day of the window (inclusive).
    pub fn window(self, now: Date) -> (Date, Date) {
        match self {
            Period::ThisMonth => (now.month_start(), now),
            Period::LastMonth => (now.previous_month_start(), now.month_start().plus_days(-1)),
            Period::PastDays(n) => (now.plus_days(1 - n as i32), now),
        }
    }

    fn phrase(self) -> String {
        match self {
            Period::ThisMonth => "this month".into(),
            Period::LastMonth => "last month".into(),
            Period::PastDays(n) => format!("in the last {n} days (today included)"),
        }
    }
}

/// What a transfer task asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TransferKind {
    /// Send a stated amount to a stated address.
    Direct {
        /// Recipient address.
        to_email: String,
        /// Recipient name.
        to_name: String,
        /// Amount in cents.
        amount_cents: i64,
    },
    /// Pay back what one person sent on a day `days_ago` days before today.
    PayBack {
        /// The person's name.
        name: String,
        /// Days before today.
        days_ago: u32,
    },
    /// Pay back every payment received in the last `days` days (today included).
    PayBackWindow {
        /// Window length in days.
        days: u32,
    },
}

/// The parameters of a task, as its request states them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "template", rename_all = "snake_case")]
pub enum Spec {
    /// See [`Template::MailCount`].
    MailCount {
        /// The sender's name.
        sender_name: String,
        /// The sender's address.
        sender_email: String,
        /// The folders to count in.
        folders: Vec<Folder>,
    },
    /// See [`Template::LikedIntersection`].
    LikedIntersection {
        /// The playlist's id.
        playlist_id: u32,
        /// The playlist's name.
        playlist_name: String,
        /// A genre the songs must also have.
        genre: Option<String>,
        /// Who to email the list to.
        recipient: Option<String>,
        /// The email's subject.
        subject: Option<String>,
    },
    /// See [`Template::PlaylistBuild`].
    PlaylistBuild {
        /// The new playlist's name.
        name: String,
        /// The artist.
        artist: String,
        /// A genre the songs must also have.
        genre: Option<String>,
        /// The songs must be released on or after this day.
        released_since: Option<Date>,
    },
    /// See [`Template::ReturnsWindow`].
    ReturnsWindow {
        /// The product noun (a case-insensitive substring of product names).
        keyword: String,
        /// The return window.
        period: Period,
    },
    /// See [`Template::AccountRecovery`].
    AccountRecovery {
        /// `payments` or `shopping`.
        app: String,
        /// The password to set.
        new_password: String,
        /// Whether to save the new password in the supervisor app too.
        update_supervisor: bool,
    },
    /// See [`Template::TransferReadback`].
    TransferReadback {
        /// What to send.
        transfer: TransferKind,
        /// The note every payment must carry.
        note: String,
    },
}

impl Spec {
    /// The template of this spec.
    pub fn template(&self) -> Template {
        match self {
            Spec::MailCount { .. } => Template::MailCount,
            Spec::LikedIntersection { .. } => Template::LikedIntersection,
            Spec::PlaylistBuild { .. } => Template::PlaylistBuild,
            Spec::ReturnsWindow { .. } => Template::ReturnsWindow,
            Spec::AccountRecovery { .. } => Template::AccountRecovery,
            Spec::TransferReadback { .. } => Template::TransferReadback,
        }
    }
}

/// A generated task: its world, its parameters and the request shown to the policy.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The initial world.
    pub world: World,
    /// The parameters.
    pub spec: Spec,
    /// The request.
    pub instruction: String,
}

/// Generate the task of `template` at `difficulty` (1 to 3) from `seed`.
pub fn generate(template: Template, difficulty: u8, seed: u64) -> Generated {
    let difficulty = difficulty.clamp(1, 3);
    let mut gen_ = Gen::new(seed);
    let mut world = g::base_world(&mut gen_);
    let (spec, instruction) = match template {
        Template::MailCount => gen_mail_count(&mut gen_, &mut world, difficulty),
        Template::LikedIntersection => gen_liked(&mut gen_, &mut world, difficulty),
        Template::PlaylistBuild => gen_playlist(&mut gen_, &mut world, difficulty),
        Template::ReturnsWindow => gen_returns(&mut gen_, &mut world, difficulty),
        Template::AccountRecovery => gen_recovery(&mut gen_, &mut world, difficulty),
        Template::TransferReadback => gen_transfer(&mut gen_, &mut world, difficulty),
    };
    Generated {
        world,
        spec,
        instruction,
    }
}

fn gen_mail_count(gen_: &mut Gen, world: &mut World, d: u8) -> (Spec, String) {
    let sender = gen_.pick(&world.contacts).clone();
    let user = world.user().clone();
    let folders = match d {
        1 => vec![Folder::Inbox],
        2 => vec![Folder::Inbox, Folder::Spam],
        _ => vec![Folder::Inbox, Folder::Spam, Folder::Archive],
    };
    let size = match d {
        1 => (9, 12),
        2 => (10, 14),
        _ => (21, 25),
    };
    for &folder in &folders {
        // One target is the oldest mail of the folder, so it sits on the last page.
        let oldest = world.now.plus_days(-(gen_.int(151, 170) as i32));
        let e = g::personal_email(gen_, &sender, &user, folder, oldest);
        g::add_email(world, e);
        for _ in 0..gen_.size(0, 2) {
            let date = world.now.plus_days(-(gen_.int(0, 150) as i32));
            let e = g::personal_email(gen_, &sender, &user, folder, date);
            g::add_email(world, e);
        }
        let target = gen_.size(size.0, size.1);
        while mail::folder_listing(world, folder).len() < target {
            let e = g::random_email(gen_, world, folder);
            g::add_email(world, e);
        }
    }
    // Near misses: the same sender in a folder not asked about, and (hard) a namesake.
    let others: Vec<Folder> = [Folder::Spam, Folder::Archive]
        .into_iter()
        .filter(|f| !folders.contains(f))
        .collect();
    for folder in others {
        let date = world.now.plus_days(-(gen_.int(0, 60) as i32));
        let e = g::personal_email(gen_, &sender, &user, folder, date);
        g::add_email(world, e);
    }
    if d == 3 {
        let last = loop {
            let l = gen_
                .pick(&["Marsh", "Holloway", "Brennan", "Sato", "Lindgren"])
                .to_string();
            if l != sender.last_name {
                break l;
            }
        };
        let namesake = super::world::Person {
            first_name: sender.first_name.clone(),
            last_name: last.clone(),
            email: format!(
                "{}.{}@{}",
                sender.first_name.to_lowercase(),
                last.to_lowercase(),
                sender.email.rsplit('@').next().unwrap_or("mailbox.example")
            ),
            phone: "555-010-0101".into(),
        };
        for &folder in &folders[..2] {
            let date = world.now.plus_days(-(gen_.int(0, 100) as i32));
            let e = g::personal_email(gen_, &namesake, &user, folder, date);
            g::add_email(world, e);
        }
        world.contacts.push(namesake);
    }
    let name = sender.full_name();
    let instruction = match d {
        1 => format!("How many emails from {name} are in my inbox? Answer with just the number."),
        2 => format!(
            "Count the emails {name} sent me that are in my inbox or my spam folder, both folders together. Answer with just the number."
        ),
        _ => format!(
            "How many emails from {name} do I have across my inbox, spam and archive folders combined? Answer with just the number."
        ),
    };
    (
        Spec::MailCount {
            sender_name: name,
            sender_email: sender.email,
            folders,
        },
        instruction,
    )
}

fn new_song_in(
    gen_: &mut Gen,
    world: &mut World,
    artist: Option<&str>,
    genre: Option<&str>,
) -> u32 {
    let song = g::new_song(gen_, world, artist, genre);
    g::add_song(world, song)
}

fn other_genre(gen_: &mut Gen, genre: &str) -> String {
    loop {
        let other = *gen_.pick(GENRES);
        if other != genre {
            return other.to_string();
        }
    }
}

fn gen_liked(gen_: &mut Gen, world: &mut World, d: u8) -> (Spec, String) {
    let genre = (d >= 2).then(|| gen_.pick(GENRES).to_string());
    let name = g::fresh_playlist_name(gen_, world);
    let mut both = Vec::new();
    let mut liked_only = Vec::new();
    let mut playlist_only = Vec::new();
    for _ in 0..gen_.size(2, 3) {
        both.push(new_song_in(gen_, world, None, genre.as_deref()));
    }
    if let Some(genre) = &genre {
        for _ in 0..gen_.size(1, 2) {
            let other = other_genre(gen_, genre);
            both.push(new_song_in(gen_, world, None, Some(&other)));
        }
    }
    let (n_liked, n_playlist) = match d {
        1 => (3, 3),
        2 => (6, 5),
        _ => (13, 6),
    };
    for _ in 0..n_liked {
        // Some distractors share the genre, so only the intersection separates them.
        let same = gen_.chance(0.5);
        liked_only.push(new_song_in(
            gen_,
            world,
            None,
            if same { genre.as_deref() } else { None },
        ));
    }
    for _ in 0..n_playlist {
        let same = gen_.chance(0.5);
        playlist_only.push(new_song_in(
            gen_,
            world,
            None,
            if same { genre.as_deref() } else { None },
        ));
    }
    // Base liked songs must not be in the new playlist, which only holds planted songs.
    let mut liked: Vec<u32> = world.music.liked.clone();
    liked.extend(&both);
    liked.extend(&liked_only);
    gen_.shuffle(&mut liked);
    // One match is the least recently liked song, on the last page.
    liked.retain(|id| *id != both[0]);
    liked.push(both[0]);
    world.music.liked = liked;
    let mut songs: Vec<u32> = both.iter().chain(&playlist_only).copied().collect();
    gen_.shuffle(&mut songs);
    let playlist_id = world
        .music
        .playlists
        .keys()
        .next_back()
        .map_or(1, |k| k + 1);
    world.music.playlists.insert(
        playlist_id,
        super::world::Playlist {
            name: name.clone(),
            song_ids: songs,
        },
    );
    let (recipient, subject) = if d == 3 {
        let who = gen_.pick(&world.contacts).clone();
        (Some(who), Some(format!("{name} favourites")))
    } else {
        (None, None)
    };
    let what = match &genre {
        None => format!("Which songs that I've liked are also in my '{name}' playlist?"),
        Some(gn) => {
            format!("Which {gn} songs are both among my liked songs and in my '{name}' playlist?")
        }
    };
    let mut instruction = format!("{what} Answer with their titles, separated by commas.");
    if let (Some(who), Some(subject)) = (&recipient, &subject) {
        instruction.push_str(&format!(
            " Also email that list of titles to {} ({}) with the subject '{subject}'.",
            who.full_name(),
            who.email
        ));
    }
    (
        Spec::LikedIntersection {
            playlist_id,
            playlist_name: name,
            genre,
            recipient: recipient.map(|p| p.email),
            subject,
        },
        instruction,
    )
}

fn gen_playlist(gen_: &mut Gen, world: &mut World, d: u8) -> (Spec, String) {
    let artist = gen_.pick(g::ARTISTS).to_string();
    let genre = (d >= 2).then(|| gen_.pick(GENRES).to_string());
    let since = (d == 3).then(|| Date::from_ymd(world.now.ymd().0 - 1, 1, 1));
    // Only planted songs by the artist are liked, so the conditions alone decide the answer.
    let songs = world.music.songs.clone();
    world
        .music
        .liked
        .retain(|id| songs.get(id).is_some_and(|s| s.artist != artist));
    let mut planted = Vec::new();
    let recent = |gen_: &mut Gen, now: Date, since: Option<Date>| match since {
        Some(s) => s.plus_days(gen_.int(0, i64::from(now.0 - s.0)) as i32),
        None => now.plus_days(-(gen_.int(30, 3000) as i32)),
    };
    for _ in 0..gen_.size(2, 3) {
        let mut song = g::new_song(gen_, world, Some(&artist), genre.as_deref());
        song.released = recent(gen_, world.now, since);
        planted.push(g::add_song(world, song));
    }
    if let Some(genre) = &genre {
        for _ in 0..gen_.size(1, 2) {
            let other = other_genre(gen_, genre);
            let mut song = g::new_song(gen_, world, Some(&artist), Some(&other));
            song.released = recent(gen_, world.now, since);
            planted.push(g::add_song(world, song));
        }
    }
    if let Some(since) = since {
        for _ in 0..gen_.size(1, 2) {
            let mut song = g::new_song(gen_, world, Some(&artist), genre.as_deref());
            song.released = since.plus_days(-(gen_.int(1, 900) as i32));
            planted.push(g::add_song(world, song));
        }
    }
    // The artist's songs in the library but not liked are near misses too.
    for _ in 0..2 {
        let id = new_song_in(gen_, world, Some(&artist), genre.as_deref());
        world.music.library.push(id);
    }
    world.music.library.sort_unstable();
    let filler = match d {
        1 => 4,
        2 => 6,
        _ => 13,
    };
    let mut liked = world.music.liked.clone();
    liked.extend(&planted);
    for _ in 0..filler {
        let mut other_artist = gen_.pick(g::ARTISTS).to_string();
        if other_artist == artist {
            other_artist = "Velvet Static".into();
        }
        liked.push(new_song_in(
            gen_,
            world,
            Some(&other_artist),
            genre.as_deref(),
        ));
    }
    gen_.shuffle(&mut liked);
    // One match is the least recently liked song, on the last page.
    liked.retain(|id| *id != planted[0]);
    liked.push(planted[0]);
    world.music.liked = liked;
    let name = format!("{} Selection", artist.trim_start_matches("The "));
    let what = match (&genre, since) {
        (None, _) => format!("every song by {artist} that I have liked"),
        (Some(gn), None) => format!("every {gn} song by {artist} among my liked songs"),
        (Some(gn), Some(_)) => format!(
            "every {gn} song by {artist} among my liked songs that was released this year or last year"
        ),
    };
    let instruction = format!(
        "Create a new playlist named '{name}' containing {what}. Then tell me how many songs the playlist has."
    );
    (
        Spec::PlaylistBuild {
            name,
            artist,
            genre,
            released_since: since,
        },
        instruction,
    )
}

fn gen_returns(gen_: &mut Gen, world: &mut World, d: u8) -> (Spec, String) {
    let keyword = gen_.pick(KEYWORDS).to_string();
    let period = match d {
        1 => Period::ThisMonth,
        2 => Period::PastDays(*gen_.pick(&[14, 30])),
        _ => Period::LastMonth,
    };
    let now = world.now;
    let (start, end) = period.window(now);
    let in_window =
        |gen_: &mut Gen| start.plus_days(gen_.int(1, i64::from(end.0 - start.0)) as i32);
    // One match is the oldest return of the window; more than a page of returns is newer.
    for i in 0..gen_.size(2, 3) {
        let product = g::product_name(gen_, &keyword);
        let date = if i == 0 { start } else { in_window(gen_) };
        g::add_return(gen_, world, product, date);
    }
    // The same product just outside the window, and other products inside it.
    let product = g::product_name(gen_, &keyword);
    g::add_return(gen_, world, product, start.plus_days(-1));
    if end < now {
        let product = g::product_name(gen_, &keyword);
        g::add_return(gen_, world, product, end.plus_days(1));
    } else {
        let product = g::product_name(gen_, &keyword);
        let date = start.plus_days(-(gen_.int(20, 80) as i32));
        g::add_return(gen_, world, product, date);
    }
    for _ in 0..gen_.size(5, 6) {
        let noun = g::other_noun(gen_, &keyword);
        let product = g::product_name(gen_, noun);
        let date = in_window(gen_);
        g::add_return(gen_, world, product, date);
    }
    let total = match d {
        1 => gen_.size(8, 10),
        2 => gen_.size(12, 15),
        _ => gen_.size(21, 25),
    };
    while world.shopping.returns.len() < total {
        let noun = g::other_noun(gen_, &keyword);
        let product = g::product_name(gen_, noun);
        let date = now.plus_days(-(gen_.int(0, 200) as i32));
        g::add_return(gen_, world, product, date);
    }
    let instruction = format!(
        "What is the total refund I got for the {}s I returned {}? Count every returned product whose name contains '{keyword}'. Answer with the dollar amount, like 123.45.",
        keyword.to_lowercase(),
        period.phrase()
    );
    (Spec::ReturnsWindow { keyword, period }, instruction)
}

fn code_email(
    world: &World,
    app: &str,
    code: &str,
    date: Date,
    folder: Folder,
) -> super::world::Email {
    let title = capitalise(app);
    super::world::Email {
        folder,
        from_name: format!("{title} Security"),
        from: sender(app),
        to: vec![world.user().email.clone()],
        subject: format!("Your {title} password reset code"),
        body: format!(
            "Someone asked to reset the password of your {title} account. Your reset code is {code}. It replaces any code sent before."
        ),
        date,
    }
}

fn gen_recovery(gen_: &mut Gen, world: &mut World, d: u8) -> (Spec, String) {
    let app = if gen_.chance(0.5) {
        "payments"
    } else {
        "shopping"
    };
    let stale = loop {
        let p = gen_.password();
        if p != world.payments.account.password && p != world.shopping.account.password {
            break p;
        }
    };
    world
        .supervisor
        .passwords
        .insert(app.to_string(), stale.clone());
    let new_password = loop {
        let p = format!("{}!", gen_.password());
        if p != stale {
            break p;
        }
    };
    if app == "shopping" {
        let noun = g::other_noun(gen_, "");
        let product = g::product_name(gen_, noun);
        let id = world
            .shopping
            .orders
            .keys()
            .next_back()
            .map_or(1, |k| k + 1);
        let price = gen_.price(10, 200);
        world.shopping.orders.insert(
            id,
            super::world::Order {
                date: world.now,
                items: vec![super::world::OrderItem {
                    product_name: product,
                    quantity: 1,
                    price_cents: price,
                }],
            },
        );
    }
    if d == 3 {
        // Earlier codes sit in the inbox; the filter now sends new codes to spam.
        for _ in 0..2 {
            let code = format!("{:06}", gen_.int(0, 999_999));
            let date = world.now.plus_days(-(gen_.int(2, 20) as i32));
            let e = code_email(world, app, &code, date, Folder::Inbox);
            g::add_email(world, e);
        }
        world.mail.spam_senders.insert(sender(app));
    }
    let title = capitalise(app);
    let question = if app == "payments" {
        "my current payments balance in dollars"
    } else {
        "the order id of my most recent shopping order"
    };
    let mut instruction = format!(
        "I can't log in to {title}: the password saved in my supervisor app no longer works. Reset my {title} password to '{new_password}' with the code {title} emails me, log in with the new password, and tell me {question}."
    );
    if d >= 2 {
        instruction.push_str(" Also save the new password in the supervisor app.");
    }
    (
        Spec::AccountRecovery {
            app: app.to_string(),
            new_password,
            update_supervisor: d >= 2,
        },
        instruction,
    )
}

fn received(who: &super::world::Person, cents: i64, date: Date, note: String) -> Transaction {
    Transaction {
        date,
        counterparty: who.email.clone(),
        counterparty_name: who.full_name(),
        amount_cents: cents,
        fee_cents: 0,
        direction: Direction::Received,
        note,
    }
}

fn gen_transfer(gen_: &mut Gen, world: &mut World, d: u8) -> (Spec, String) {
    let now = world.now;
    let (transfer, note, total) = match d {
        1 => {
            let who = gen_.pick(&world.contacts).clone();
            let note = g::note(gen_);
            (
                TransferKind::Direct {
                    to_email: who.email.clone(),
                    to_name: who.full_name(),
                    amount_cents: gen_.price(10, 90),
                },
                note,
                gen_.size(8, 10),
            )
        }
        2 => {
            let who = gen_.pick(&world.contacts).clone();
            let days_ago = gen_.int(8, 25) as u32;
            let day = now.plus_days(-(days_ago as i32));
            world
                .payments
                .transactions
                .retain(|_, t| !(t.date == day || t.counterparty == who.email));
            let t = received(&who, gen_.price(10, 90), day, g::note(gen_));
            g::add_transaction(world, t);
            for _ in 0..2 {
                let other_day = day.plus_days(*gen_.pick(&[-9, -4, 3, 6]));
                let other_day = other_day.min(now);
                if other_day != day {
                    let t = received(&who, gen_.price(10, 90), other_day, g::note(gen_));
                    g::add_transaction(world, t);
                }
            }
            let other = loop {
                let p = gen_.pick(&world.contacts).clone();
                if p.email != who.email {
                    break p;
                }
            };
            let t = received(&other, gen_.price(10, 90), day, g::note(gen_));
            g::add_transaction(world, t);
            // More than a page of newer transactions with other people.
            for _ in 0..5 {
                let date = day.plus_days(gen_.int(1, i64::from(days_ago)) as i32);
                let t = g::random_transaction(gen_, world, date);
                if t.counterparty != who.email {
                    g::add_transaction(world, t);
                }
            }
            (
                TransferKind::PayBack {
                    name: who.full_name(),
                    days_ago,
                },
                "refund".to_string(),
                gen_.size(14, 18),
            )
        }
        _ => {
            let days = 7;
            let start = now.plus_days(1 - days as i32);
            world
                .payments
                .transactions
                .retain(|_, t| !(t.date >= start && t.direction == Direction::Received));
            let mut people = world.contacts.clone();
            gen_.shuffle(&mut people);
            let k = gen_.size(2, 3);
            // One payment to return is the oldest of the window, below a page of newer ones.
            for who in &people[k + 2..k + 8] {
                let mut t = g::random_transaction(gen_, world, now);
                t.date = start.plus_days(gen_.int(1, i64::from(days) - 1) as i32);
                t.direction = Direction::Sent;
                t.fee_cents = super::apps::payments::fee(t.amount_cents, world.payments.fee_bps);
                t.counterparty = who.email.clone();
                t.counterparty_name = who.full_name();
                g::add_transaction(world, t);
            }
            for (i, who) in people[..k].iter().enumerate() {
                let date = if i == 0 {
                    start
                } else {
                    start.plus_days(gen_.int(0, i64::from(days) - 1) as i32)
                };
                let t = received(who, gen_.price(10, 80), date, g::note(gen_));
                g::add_transaction(world, t);
            }
            for (i, who) in people[k..k + 2].iter().enumerate() {
                let date = start.plus_days(-1 - 2 * i as i32);
                let t = received(who, gen_.price(10, 80), date, g::note(gen_));
                g::add_transaction(world, t);
            }
            (
                TransferKind::PayBackWindow { days },
                "paid back".to_string(),
                gen_.size(21, 24),
            )
        }
    };
    // Fillers never add a received payment inside a window the task asks about.
    let protected = match &transfer {
        TransferKind::PayBackWindow { days } => Some(now.plus_days(1 - *days as i32)),
        _ => None,
    };
    let busy: BTreeSet<Date> = match &transfer {
        TransferKind::PayBack { days_ago, .. } => [now.plus_days(-(*days_ago as i32))].into(),
        _ => BTreeSet::new(),
    };
    let avoid_name = match &transfer {
        TransferKind::PayBack { name, .. } => Some(name.clone()),
        _ => None,
    };
    while world.payments.transactions.len() < total {
        let date = now.plus_days(-(gen_.int(0, 60) as i32));
        let t = g::random_transaction(gen_, world, date);
        let in_protected =
            protected.is_some_and(|s| t.date >= s) && t.direction == Direction::Received;
        if in_protected
            || busy.contains(&t.date)
            || avoid_name.as_deref() == Some(t.counterparty_name.as_str())
        {
            continue;
        }
        g::add_transaction(world, t);
    }
    let instruction = match &transfer {
        TransferKind::Direct {
            to_email,
            to_name,
            amount_cents,
        } => format!(
            "Send ${}.{:02} to {to_name} ({to_email}) on payments with the note '{note}'. Then tell me my payments balance in dollars after the transfer.",
            amount_cents / 100,
            amount_cents % 100
        ),
        TransferKind::PayBack { name, days_ago } => format!(
            "{name} sent me money on payments {days_ago} days ago. Send them back the same amount with the note '{note}', then tell me my payments balance in dollars after that."
        ),
        TransferKind::PayBackWindow { days } => format!(
            "Pay back every payment I received on payments in the last {days} days (today included): send each sender the amount they sent, with the note '{note}'. Then tell me my payments balance in dollars."
        ),
    };
    (Spec::TransferReadback { transfer, note }, instruction)
}

/// The ground truth of a task, computed from its initial world.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Expected {
    /// An integer answer.
    Count(i64),
    /// A dollar answer in cents.
    Cents(i64),
    /// A set of titles (lowercase).
    Titles(Vec<String>),
    /// Song ids a new playlist must hold, answered by their count.
    PlaylistSongs(Vec<u32>),
    /// A password reset; the answer is read from the final state.
    Recovery,
    /// Payments to make `(address, cents)`; the answer is the final balance.
    Transfers(Vec<(String, i64)>),
}

/// Compute the ground truth of `spec` on the initial world.
pub fn expected(spec: &Spec, world: &World) -> Expected {
    match spec {
        Spec::MailCount {
            sender_email,
            folders,
            ..
        } => Expected::Count(
            world
                .mail
                .emails
                .values()
                .filter(|e| {
                    folders.contains(&e.folder) && e.from.eq_ignore_ascii_case(sender_email)
                })
                .count() as i64,
        ),
        Spec::LikedIntersection {
            playlist_id, genre, ..
        } => {
            let playlist: BTreeSet<u32> = world
                .music
                .playlists
                .get(playlist_id)
                .map(|p| p.song_ids.iter().copied().collect())
                .unwrap_or_default();
            let mut titles: Vec<String> = world
                .music
                .liked
                .iter()
                .filter(|id| playlist.contains(id))
                .filter_map(|id| world.music.songs.get(id))
                .filter(|s| genre.as_ref().is_none_or(|gn| s.genre == *gn))
                .map(|s| s.title.to_lowercase())
                .collect();
            titles.sort();
            Expected::Titles(titles)
        }
        Spec::PlaylistBuild {
            artist,
            genre,
            released_since,
            ..
        } => {
            let mut ids: Vec<u32> = world
                .music
                .liked
                .iter()
                .copied()
                .filter(|id| {
                    world.music.songs.get(id).is_some_and(|s| {
                        s.artist == *artist
                            && genre.as_ref().is_none_or(|gn| s.genre == *gn)
                            && released_since.is_none_or(|d| s.released >= d)
                    })
                })
                .collect();
            ids.sort_unstable();
            Expected::PlaylistSongs(ids)
        }
        Spec::ReturnsWindow { keyword, period } => {
            let (start, end) = period.window(world.now);
            let keyword = keyword.to_lowercase();
            Expected::Cents(
                world
                    .shopping
                    .returns
                    .values()
                    .filter(|r| {
                        r.product_name.to_lowercase().contains(&keyword)
                            && r.returned_at >= start
                            && r.returned_at <= end
                    })
                    .map(|r| r.refund_cents)
                    .sum(),
            )
        }
        Spec::AccountRecovery { .. } => Expected::Recovery,
        Spec::TransferReadback { transfer, .. } => {
            let now = world.now;
            let mut out: Vec<(String, i64)> = match transfer {
                TransferKind::Direct {
                    to_email,
                    amount_cents,
                    ..
                } => vec![(to_email.to_lowercase(), *amount_cents)],
                TransferKind::PayBack { name, days_ago } => {
                    let day = now.plus_days(-(*days_ago as i32));
                    world
                        .payments
                        .transactions
                        .values()
                        .filter(|t| {
                            t.direction == Direction::Received
                                && t.date == day
                                && t.counterparty_name == *name
                        })
                        .map(|t| (t.counterparty.to_lowercase(), t.amount_cents))
                        .collect()
                }
                TransferKind::PayBackWindow { days } => {
                    let start = now.plus_days(1 - *days as i32);
                    world
                        .payments
                        .transactions
                        .values()
                        .filter(|t| {
                            t.direction == Direction::Received && t.date >= start && t.date <= now
                        })
                        .map(|t| (t.counterparty.to_lowercase(), t.amount_cents))
                        .collect()
                }
            };
            out.sort();
            Expected::Transfers(out)
        }
    }
}

fn number_re() -> &'static Regex {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"-?\d+(?:\.\d+)?").unwrap_or_else(|_| unreachable!("the pattern is valid"))
    })
}

/// The single number in an answer (thousands separators and `$` allowed); `None` when there is
/// no number or more than one.
pub fn single_number(answer: &str) -> Option<f64> {
    let cleaned: String = answer.replace([',', '$'], "");
    let mut found = number_re().find_iter(&cleaned);
    let first = found.next()?;
    if found.next().is_some() {
        return None;
    }
    first.as_str().parse().ok()
}

/// The items of a list answer: split on commas, semicolons and new lines, trimmed, unquoted,
/// lowercased.
pub fn list_items(answer: &str) -> BTreeSet<String> {
    answer
        .split([',', ';', '\n'])
        .map(|item| {
            let item = item.trim().trim_start_matches("and ").trim();
            let item = item.trim_start_matches(['-', '*', ' ']);
            item.trim_matches(|c: char| c == '"' || c == '\'' || c == '.' || c.is_whitespace())
                .to_lowercase()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// A predicate accepting a change the task intends.
type Allowance<'a> = Box<dyn Fn(&Change) -> bool + 'a>;

struct Checks {
    items: Vec<Value>,
    ok: bool,
}

impl Checks {
    fn new() -> Self {
        Checks {
            items: Vec::new(),
            ok: true,
        }
    }

    fn add(&mut self, name: &str, ok: bool, detail: Value) {
        self.ok &= ok;
        self.items
            .push(json!({"check": name, "ok": ok, "detail": detail}));
    }
}

fn answer_cents(checks: &mut Checks, answer: &str, want: i64) {
    let given = single_number(answer);
    let ok = given.is_some_and(|v| (v * 100.0 - want as f64).abs() <= 1.0 + 1e-6);
    checks.add(
        "answer",
        ok,
        json!({"expected": want as f64 / 100.0, "given": answer}),
    );
}

fn answer_count(checks: &mut Checks, answer: &str, want: i64) {
    let given = single_number(answer);
    let ok = given.is_some_and(|v| (v - want as f64).abs() < 1e-9);
    checks.add("answer", ok, json!({"expected": want, "given": answer}));
}

/// Judge an episode: the submitted answer, the final state, and collateral damage.
pub fn verify(
    spec: &Spec,
    difficulty: u8,
    initial: &World,
    end: &World,
    submitted: Option<&str>,
    final_text: Option<&str>,
) -> (bool, Value) {
    let mut checks = Checks::new();
    checks.add(
        "submitted with complete_task",
        submitted.is_some(),
        json!({"final_text_without_submit": final_text}),
    );
    let answer = submitted.unwrap_or("").trim();
    let changes = diff(&initial.snapshot(), &end.snapshot());
    let expected = expected(spec, initial);
    let mut allowed: Vec<Allowance<'_>> = Vec::new();
    let added_id = |c: &Change, prefix: &str| -> Option<u32> {
        match c {
            Change::Added(p) => p.strip_prefix(prefix).and_then(|rest| rest.parse().ok()),
            _ => None,
        }
    };
    match (spec, &expected) {
        (Spec::MailCount { .. }, Expected::Count(want)) => answer_count(&mut checks, answer, *want),
        (Spec::ReturnsWindow { .. }, Expected::Cents(want)) => {
            answer_cents(&mut checks, answer, *want)
        }
        (
            Spec::LikedIntersection {
                playlist_id,
                recipient,
                subject,
                ..
            },
            Expected::Titles(want),
        ) => {
            let want_set: BTreeSet<String> = want.iter().cloned().collect();
            let given = list_items(answer);
            checks.add(
                "answer",
                given == want_set,
                json!({"expected": want, "given": answer, "missing": want_set.difference(&given).collect::<Vec<_>>(), "extra": given.difference(&want_set).collect::<Vec<_>>()}),
            );
            if let (Some(to), Some(subject)) = (recipient, subject) {
                let sent: Vec<&super::world::Email> = changes
                    .iter()
                    .filter_map(|c| added_id(c, "mail.emails."))
                    .filter_map(|id| end.mail.emails.get(&id))
                    .filter(|e| e.folder == Folder::Sent)
                    .collect();
                let distractors: BTreeSet<String> = initial
                    .music
                    .liked
                    .iter()
                    .chain(
                        initial
                            .music
                            .playlists
                            .get(playlist_id)
                            .map(|p| p.song_ids.as_slice())
                            .unwrap_or(&[]),
                    )
                    .filter_map(|id| initial.music.songs.get(id))
                    .map(|s| s.title.to_lowercase())
                    .filter(|t| {
                        !want_set.contains(t) && !want_set.iter().any(|w| w.contains(t.as_str()))
                    })
                    .collect();
                let good = sent.len() == 1 && {
                    let e = sent[0];
                    let body = e.body.to_lowercase();
                    e.to.len() == 1
                        && e.to[0].eq_ignore_ascii_case(to)
                        && e.subject.trim().eq_ignore_ascii_case(subject.trim())
                        && want.iter().all(|t| body.contains(t.as_str()))
                        && !distractors.iter().any(|t| body.contains(t.as_str()))
                };
                checks.add(
                    "one email with exactly the titles sent to the recipient",
                    good,
                    json!({"to": to, "subject": subject, "sent": sent.iter().map(|e| json!({"to": e.to, "subject": e.subject, "body": e.body})).collect::<Vec<_>>()}),
                );
                allowed.push(Box::new(move |c: &Change| {
                    added_id(c, "mail.emails.")
                        .and_then(|id| end.mail.emails.get(&id))
                        .is_some_and(|e| e.folder == Folder::Sent)
                }));
            }
        }
        (Spec::PlaylistBuild { name, .. }, Expected::PlaylistSongs(want)) => {
            let created: Vec<u32> = changes
                .iter()
                .filter_map(|c| added_id(c, "music.playlists."))
                .collect();
            let playlist = (created.len() == 1)
                .then(|| end.music.playlists.get(&created[0]))
                .flatten();
            let name_ok = playlist.is_some_and(|p| p.name.trim().eq_ignore_ascii_case(name.trim()));
            checks.add(
                "exactly one new playlist with the requested name",
                name_ok,
                json!({"expected_name": name, "created": created.iter().filter_map(|id| end.music.playlists.get(id)).map(|p| &p.name).collect::<Vec<_>>()}),
            );
            let songs: Vec<u32> = playlist.map(|p| p.song_ids.clone()).unwrap_or_default();
            let mut sorted = songs.clone();
            sorted.sort_unstable();
            checks.add(
                "the playlist holds exactly the matching songs",
                sorted == *want,
                json!({"expected_song_ids": want, "song_ids": songs}),
            );
            answer_count(&mut checks, answer, want.len() as i64);
            let created_ids = created.clone();
            allowed.push(Box::new(move |c: &Change| {
                added_id(c, "music.playlists.").is_some_and(|id| created_ids.contains(&id))
            }));
        }
        (
            Spec::AccountRecovery {
                app,
                new_password,
                update_supervisor,
            },
            Expected::Recovery,
        ) => {
            let account = if app == "payments" {
                &end.payments.account
            } else {
                &end.shopping.account
            };
            checks.add(
                "the account password is the new one",
                account.password == *new_password,
                json!({"app": app}),
            );
            let saved = end.supervisor.passwords.get(app.as_str());
            if *update_supervisor {
                checks.add(
                    "the supervisor app saves the new password",
                    saved == Some(new_password),
                    json!({"saved": saved}),
                );
            }
            if app == "payments" {
                answer_cents(&mut checks, answer, end.payments.balance_cents);
            } else {
                let latest = shopping::order_listing(end)
                    .first()
                    .map_or(0, |(id, _)| *id);
                answer_count(&mut checks, answer, i64::from(latest));
            }
            let app = app.clone();
            let new_password = new_password.clone();
            let code_sender = sender(&app);
            allowed.push(Box::new(move |c: &Change| match c {
                Change::Changed(p) => {
                    *p == format!("{app}.account.password")
                        || (*p == format!("supervisor.passwords.{app}")
                            && end.supervisor.passwords.get(app.as_str()) == Some(&new_password))
                }
                Change::Added(_) => added_id(c, "mail.emails.")
                    .and_then(|id| end.mail.emails.get(&id))
                    .is_some_and(|e| e.from == code_sender),
                Change::Removed(_) => false,
            }));
        }
        (Spec::TransferReadback { note, .. }, Expected::Transfers(want)) => {
            let new: Vec<&Transaction> = changes
                .iter()
                .filter_map(|c| added_id(c, "payments.transactions."))
                .filter_map(|id| end.payments.transactions.get(&id))
                .collect();
            let mut made: Vec<(String, i64)> = new
                .iter()
                .filter(|t| t.direction == Direction::Sent)
                .map(|t| (t.counterparty.to_lowercase(), t.amount_cents))
                .collect();
            made.sort();
            checks.add(
                "exactly the requested payments were sent",
                made == *want && made.len() == new.len(),
                json!({"expected": want.iter().map(|(to, c)| json!({"to": to, "amount": *c as f64 / 100.0})).collect::<Vec<_>>(),
                       "sent": made.iter().map(|(to, c)| json!({"to": to, "amount": *c as f64 / 100.0})).collect::<Vec<_>>()}),
            );
            let notes_ok = new
                .iter()
                .all(|t| t.note.trim().eq_ignore_ascii_case(note.trim()));
            checks.add(
                "every payment carries the note",
                notes_ok,
                json!({"note": note, "notes": new.iter().map(|t| &t.note).collect::<Vec<_>>()}),
            );
            answer_cents(&mut checks, answer, end.payments.balance_cents);
            allowed.push(Box::new(move |c: &Change| {
                added_id(c, "payments.transactions.").is_some()
                    || *c == Change::Changed("payments.balance_cents".into())
            }));
        }
        _ => checks.add(
            "spec",
            false,
            json!("the template and its ground truth disagree"),
        ),
    }
    let collateral: Vec<&Change> = changes
        .iter()
        .filter(|c| !allowed.iter().any(|f| f(c)))
        .collect();
    checks.add(
        "no collateral changes",
        collateral.is_empty(),
        json!(collateral),
    );
    let details = json!({
        "template": spec.template().as_str(),
        "difficulty": difficulty,
        "submitted_answer": submitted,
        "checks": checks.items,
        "failed": checks.items.iter().filter(|c| c["ok"] == json!(false)).map(|c| c["check"].clone()).collect::<Vec<_>>(),
    });
    (checks.ok, details)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::DEFAULT_PAGE_SIZE;

    fn all_generated() -> Vec<(Template, u8, Generated)> {
        let mut out = Vec::new();
        for template in Template::ALL {
            for difficulty in 1..=3 {
                for seed in 0..40u64 {
                    out.push((
                        template,
                        difficulty,
                        generate(template, difficulty, seed * 7919 + 13),
                    ));
                }
            }
        }
        out
    }

    #[test]
    fn generation_is_deterministic() {
        for template in Template::ALL {
            let a = generate(template, 3, 99);
            let b = generate(template, 3, 99);
            assert_eq!(a.world, b.world);
            assert_eq!(a.spec, b.spec);
            assert_eq!(a.instruction, b.instruction);
            assert_ne!(generate(template, 3, 100).world, a.world);
        }
    }

    /// Every task needs the behaviour its template is about: more than one page, a non-empty
    /// answer that a union or a looser filter would get wrong.
    #[test]
    fn tasks_need_their_behaviour() {
        for (template, d, g) in all_generated() {
            let w = &g.world;
            let label = format!("{template:?} d{d}: {}", g.instruction);
            if d == 3 {
                // Hard tasks need a second page even at the largest page size.
                let longest = match &g.spec {
                    Spec::MailCount { folders, .. } => folders
                        .iter()
                        .map(|f| mail::folder_listing(w, *f).len())
                        .min()
                        .unwrap_or(0),
                    Spec::LikedIntersection { .. } | Spec::PlaylistBuild { .. } => {
                        w.music.liked.len()
                    }
                    Spec::ReturnsWindow { .. } => w.shopping.returns.len(),
                    Spec::TransferReadback { .. } => w.payments.transactions.len(),
                    Spec::AccountRecovery { .. } => usize::MAX,
                };
                assert!(longest > crate::apps::MAX_PAGE_SIZE, "{label}: {longest}");
            }
            match (&g.spec, expected(&g.spec, w)) {
                (
                    Spec::MailCount {
                        folders,
                        sender_email,
                        ..
                    },
                    Expected::Count(n),
                ) => {
                    assert!(n >= folders.len() as i64, "{label}");
                    for f in folders {
                        let listing = mail::folder_listing(w, *f);
                        assert!(listing.len() > DEFAULT_PAGE_SIZE, "{label}");
                        // A target sits beyond the first page of every folder.
                        assert!(
                            listing[DEFAULT_PAGE_SIZE..]
                                .iter()
                                .any(|(_, e)| e.from == *sender_email),
                            "{label}"
                        );
                    }
                    // A reader of only some folders, or of every folder, gets another count.
                    let everywhere = w
                        .mail
                        .emails
                        .values()
                        .filter(|e| e.from == *sender_email)
                        .count() as i64;
                    assert!(everywhere > n || folders.len() == 3, "{label}");
                }
                (
                    Spec::LikedIntersection {
                        playlist_id, genre, ..
                    },
                    Expected::Titles(titles),
                ) => {
                    assert!(titles.len() >= 2, "{label}");
                    let playlist = &w.music.playlists[playlist_id].song_ids;
                    let union = w
                        .music
                        .liked
                        .iter()
                        .chain(playlist)
                        .collect::<BTreeSet<_>>()
                        .len();
                    assert!(union > titles.len() + 4, "{label}");
                    assert!(w.music.liked.len() > DEFAULT_PAGE_SIZE, "{label}");
                    let beyond_first_page = w.music.liked[DEFAULT_PAGE_SIZE..]
                        .iter()
                        .any(|id| titles.contains(&w.music.songs[id].title.to_lowercase()));
                    assert!(beyond_first_page, "{label}");
                    if genre.is_some() {
                        let both = w
                            .music
                            .liked
                            .iter()
                            .filter(|id| playlist.contains(id))
                            .count();
                        assert!(both > titles.len(), "{label}");
                    }
                }
                (Spec::PlaylistBuild { artist, .. }, Expected::PlaylistSongs(ids)) => {
                    assert!((2..=6).contains(&ids.len()), "{label}");
                    let by_artist = w
                        .music
                        .liked
                        .iter()
                        .filter(|id| w.music.songs[id].artist == *artist)
                        .count();
                    assert!(by_artist > ids.len() || d == 1, "{label}");
                    assert!(w.music.liked.len() > DEFAULT_PAGE_SIZE, "{label}");
                    assert!(
                        w.music.liked[DEFAULT_PAGE_SIZE..]
                            .iter()
                            .any(|id| ids.contains(id)),
                        "{label}"
                    );
                }
                (Spec::ReturnsWindow { keyword, period }, Expected::Cents(c)) => {
                    assert!(c > 0, "{label}");
                    let (start, end) = period.window(w.now);
                    let listing = shopping::return_listing(w);
                    let beyond_first_page = listing[DEFAULT_PAGE_SIZE..].iter().any(|(_, r)| {
                        r.product_name.contains(keyword.as_str())
                            && r.returned_at >= start
                            && r.returned_at <= end
                    });
                    assert!(beyond_first_page, "{label}");
                    assert!(w.shopping.returns.len() > DEFAULT_PAGE_SIZE, "{label}");
                    let any_time: i64 = w
                        .shopping
                        .returns
                        .values()
                        .filter(|r| r.product_name.contains(keyword.as_str()))
                        .map(|r| r.refund_cents)
                        .sum();
                    assert!(any_time > c, "{label}");
                }
                (Spec::AccountRecovery { app, .. }, Expected::Recovery) => {
                    let saved = &w.supervisor.passwords[app];
                    let real = if app == "payments" {
                        &w.payments.account.password
                    } else {
                        &w.shopping.account.password
                    };
                    assert_ne!(saved, real, "{label}");
                }
                (Spec::TransferReadback { transfer, .. }, Expected::Transfers(list)) => {
                    assert!(!list.is_empty(), "{label}");
                    if let TransferKind::PayBack { .. } = transfer {
                        assert_eq!(list.len(), 1, "{label}");
                    }
                    if !matches!(transfer, TransferKind::Direct { .. }) {
                        let listing = crate::apps::payments::transaction_listing(w);
                        let on_first_page = listing[..DEFAULT_PAGE_SIZE]
                            .iter()
                            .filter(|(_, t)| {
                                t.direction == Direction::Received
                                    && list.contains(&(t.counterparty.clone(), t.amount_cents))
                            })
                            .count();
                        assert!(on_first_page < list.len(), "{label}");
                    }
                    assert!(w.payments.fee_bps > 0, "{label}");
                    let total: i64 = list.iter().map(|(_, c)| c).sum();
                    assert!(w.payments.balance_cents > 2 * total, "{label}");
                }
                (spec, e) => panic!("{spec:?} has ground truth {e:?}"),
            }
        }
    }

    #[test]
    fn answers_are_read_leniently_but_exactly() {
        assert_eq!(single_number("$1,234.50"), Some(1234.5));
        assert_eq!(single_number("The total is 12.30 dollars"), Some(12.3));
        assert_eq!(single_number("between 3 and 4"), None);
        assert_eq!(single_number(""), None);
        let items = list_items("\"Golden River\", and Neon Parade.\n- Wild Canyon");
        assert_eq!(
            items,
            ["golden river", "neon parade", "wild canyon"]
                .map(String::from)
                .into()
        );
    }

    #[test]
    fn periods_are_inclusive_windows() {
        let now = Date::parse("2024-03-15").unwrap_or(Date(0));
        let show = |p: Period| {
            let (a, b) = p.window(now);
            format!("{a}..{b}")
        };
        assert_eq!(show(Period::ThisMonth), "2024-03-01..2024-03-15");
        assert_eq!(show(Period::LastMonth), "2024-02-01..2024-02-29");
        assert_eq!(show(Period::PastDays(7)), "2024-03-09..2024-03-15");
    }
}
