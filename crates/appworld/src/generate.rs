//! Seeded generation of a base world: people, mail, music, payments, shopping.
//!
//! Task templates start from this world and plant what their question needs (target records
//! and near-miss distractors). Everything is drawn from one ChaCha stream, so the same seed
//! always yields the same world.

use std::collections::{BTreeMap, BTreeSet};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::date::Date;
use super::world::{
    Account, Direction, Email, Folder, MailApp, MusicApp, Order, OrderItem, PaymentsApp, Person,
    Playlist, Return, ShoppingApp, Song, SupervisorApp, Transaction, World,
};

const FIRST_NAMES: &[&str] = &[
    "Alice", "Bruno", "Carmen", "Dmitri", "Elena", "Farah", "Gustavo", "Hana", "Ivan", "Jasmine",
    "Kenji", "Laila", "Marco", "Nadia", "Oscar", "Priya", "Quentin", "Rosa", "Samir", "Tamara",
    "Umar", "Vera", "Wesley", "Ximena", "Yusuf", "Zoe", "Andre", "Beatriz", "Chloe", "Diego",
];

const LAST_NAMES: &[&str] = &[
    "Abbott",
    "Baptiste",
    "Castillo",
    "Dubois",
    "Eriksen",
    "Fontaine",
    "Garcia",
    "Haddad",
    "Ibrahim",
    "Jensen",
    "Kowalski",
    "Lindqvist",
    "Moreau",
    "Nakamura",
    "Okafor",
    "Petrov",
    "Quinn",
    "Rossi",
    "Schmidt",
    "Tanaka",
    "Umarov",
    "Varga",
    "Whitfield",
    "Xu",
    "Yilmaz",
    "Zimmermann",
];

const DOMAINS: &[&str] = &["mailbox.example", "postbox.example", "inbox.example"];

const SUBJECTS: &[&str] = &[
    "Lunch next week?",
    "Photos from the trip",
    "Quick question",
    "Meeting notes",
    "Happy birthday!",
    "Book recommendation",
    "Weekend plans",
    "Re: the invoice",
    "Moving day help",
    "Concert tickets",
    "Recipe you asked for",
    "Project update",
    "Can you call me?",
    "Garden club reminder",
    "Running group schedule",
];

const SPAM_SUBJECTS: &[&str] = &[
    "You have WON a prize",
    "Limited offer: 90% off",
    "Your account needs attention",
    "Claim your reward now",
    "Exclusive deal inside",
];

const SPAM_SENDERS: &[(&str, &str)] = &[
    ("Prize Center", "winner@prizes.example.net"),
    ("Mega Deals", "offers@megadeals.example.net"),
    ("Account Team", "alerts@secure-login.example.net"),
];

const TITLE_A: &[&str] = &[
    "Midnight", "Golden", "Electric", "Silent", "Paper", "Velvet", "Neon", "Crystal", "Broken",
    "Wild", "Hollow", "Summer", "Frozen", "Distant", "Burning", "Lucky",
];

const TITLE_B: &[&str] = &[
    "River",
    "Highway",
    "Garden",
    "Echoes",
    "Lanterns",
    "Horizon",
    "Satellites",
    "Harbor",
    "Mirrors",
    "Engines",
    "Thunder",
    "Letters",
    "Oceans",
    "Shadows",
    "Canyon",
    "Parade",
];

/// Artists of the catalogue.
pub const ARTISTS: &[&str] = &[
    "The Copper Foxes",
    "Luna Vale",
    "Static Orchard",
    "Marisol Reyes",
    "Northbound",
    "The Quiet Hours",
    "Jonah Steele",
    "Kite Theory",
    "Amber Lights",
    "Devon Park",
];

/// Genres of the catalogue.
pub const GENRES: &[&str] = &["rock", "pop", "jazz", "folk", "electronic", "hip hop"];

const PLAYLIST_NAMES: &[&str] = &[
    "Morning Run",
    "Focus Mode",
    "Road Trip",
    "Sunday Chill",
    "Dinner Party",
    "Late Night",
    "Workout Mix",
    "Rainy Days",
];

/// Product nouns that may be asked about (no one is a substring of another product name).
pub const KEYWORDS: &[&str] = &[
    "Desk", "Chair", "Lamp", "Monitor", "Keyboard", "Backpack", "Mug", "Rug",
];

const OTHER_PRODUCTS: &[&str] = &[
    "Bookshelf",
    "Headphones",
    "Blender",
    "Water Bottle",
    "Notebook",
];

const PRODUCT_ADJ: &[&str] = &[
    "Compact",
    "Deluxe",
    "Classic",
    "Ergonomic",
    "Modern",
    "Foldable",
    "Vintage",
    "Premium",
];

const MATERIALS: &[&str] = &[
    "Oak", "Steel", "Bamboo", "Walnut", "Ceramic", "Canvas", "Glass", "Wool",
];

const NOTES: &[&str] = &[
    "dinner",
    "concert tickets",
    "groceries",
    "taxi",
    "rent share",
    "birthday gift",
    "movie night",
    "coffee",
    "book club",
    "gas money",
    "pizza",
    "museum tickets",
];

/// A seeded generator with small helpers.
pub struct Gen {
    /// The random stream.
    pub rng: ChaCha8Rng,
}

impl Gen {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Gen {
        Gen {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// An integer in `lo..=hi`.
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        self.rng.gen_range(lo..=hi)
    }

    /// A size in `lo..=hi`.
    pub fn size(&mut self, lo: usize, hi: usize) -> usize {
        self.rng.gen_range(lo..=hi)
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.rng.gen_range(0..items.len())]
    }

    /// A coin flip with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.rng.gen_bool(p)
    }

    /// Shuffle in place.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        items.shuffle(&mut self.rng);
    }

    /// A password-looking string.
    pub fn password(&mut self) -> String {
        const WORDS: &[&str] = &[
            "maple", "tiger", "cobalt", "orbit", "pepper", "harbor", "quartz", "meadow", "falcon",
            "ember",
        ];
        format!(
            "{}-{}-{}",
            self.pick(WORDS),
            self.pick(WORDS),
            self.int(10, 99)
        )
    }

    /// A price in cents within `lo..=hi` dollars, ending in .99, .49 or whole.
    pub fn price(&mut self, lo: i64, hi: i64) -> i64 {
        let dollars = self.int(lo, hi);
        let cents = *self.pick(&[0, 49, 99]);
        dollars * 100 + cents
    }
}

/// Generate people with distinct full names.
fn people(g: &mut Gen, count: usize) -> Vec<Person> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    while out.len() < count {
        let first = *g.pick(FIRST_NAMES);
        let last = *g.pick(LAST_NAMES);
        if !seen.insert((first, last)) {
            continue;
        }
        let domain = *g.pick(DOMAINS);
        out.push(Person {
            first_name: first.to_string(),
            last_name: last.to_string(),
            email: format!("{}.{}@{domain}", first.to_lowercase(), last.to_lowercase()),
            phone: format!("555-{:03}-{:04}", g.int(100, 999), g.int(0, 9999)),
        });
    }
    out
}

/// An ordinary email from a contact (or a spam sender when filed in spam).
pub fn random_email(g: &mut Gen, world: &World, folder: Folder) -> Email {
    let user = world.user().clone();
    let now = world.now;
    let date = now.plus_days(-(g.int(0, 150) as i32));
    match folder {
        Folder::Spam if g.chance(0.7) => {
            let (name, addr) = *g.pick(SPAM_SENDERS);
            Email {
                folder,
                from_name: name.to_string(),
                from: addr.to_string(),
                to: vec![user.email],
                subject: g.pick(SPAM_SUBJECTS).to_string(),
                body: "Click the link below to continue.".to_string(),
                date,
            }
        }
        Folder::Sent => {
            let to = g.pick(&world.contacts).clone();
            Email {
                folder,
                from_name: user.full_name(),
                from: user.email,
                to: vec![to.email],
                subject: g.pick(SUBJECTS).to_string(),
                body: format!("Hi {}, just following up.", to.first_name),
                date,
            }
        }
        _ => {
            let from = g.pick(&world.contacts).clone();
            personal_email(g, &from, &user, folder, date)
        }
    }
}

/// An email from `from` to `user`.
pub fn personal_email(
    g: &mut Gen,
    from: &Person,
    user: &Person,
    folder: Folder,
    date: Date,
) -> Email {
    Email {
        folder,
        from_name: from.full_name(),
        from: from.email.clone(),
        to: vec![user.email.clone()],
        subject: g.pick(SUBJECTS).to_string(),
        body: format!(
            "Hi {},\n\nLet me know what you think.\n\n{}",
            user.first_name, from.first_name
        ),
        date,
    }
}

/// Insert an email with the next free id.
pub fn add_email(world: &mut World, email: Email) -> u32 {
    let id = world.next_email_id();
    world.mail.emails.insert(id, email);
    id
}

/// A song with a title not yet in the catalogue.
pub fn new_song(g: &mut Gen, world: &World, artist: Option<&str>, genre: Option<&str>) -> Song {
    let titles: BTreeSet<&str> = world
        .music
        .songs
        .values()
        .map(|s| s.title.as_str())
        .collect();
    let title = loop {
        let t = format!("{} {}", g.pick(TITLE_A), g.pick(TITLE_B));
        if !titles.contains(t.as_str()) {
            break t;
        }
    };
    Song {
        title,
        artist: artist.map_or_else(|| g.pick(ARTISTS).to_string(), str::to_string),
        genre: genre.map_or_else(|| g.pick(GENRES).to_string(), str::to_string),
        duration_s: g.int(140, 380) as u32,
        released: world.now.plus_days(-(g.int(30, 3650) as i32)),
    }
}

/// Add a song to the catalogue, returning its id.
pub fn add_song(world: &mut World, song: Song) -> u32 {
    let id = world.music.songs.keys().next_back().map_or(1, |k| k + 1);
    world.music.songs.insert(id, song);
    id
}

/// A product name.
pub fn product_name(g: &mut Gen, noun: &str) -> String {
    format!("{} {} {}", g.pick(PRODUCT_ADJ), g.pick(MATERIALS), noun)
}

/// A product noun that is not `avoid`.
pub fn other_noun<'a>(g: &mut Gen, avoid: &str) -> &'a str {
    loop {
        let noun = if g.chance(0.3) {
            *g.pick(OTHER_PRODUCTS)
        } else {
            *g.pick(KEYWORDS)
        };
        if noun != avoid {
            return noun;
        }
    }
}

/// Add an order holding one item and a return of it on `returned_at`.
pub fn add_return(g: &mut Gen, world: &mut World, product: String, returned_at: Date) -> u32 {
    let price = g.price(15, 400);
    let order_date = returned_at.plus_days(-(g.int(3, 40) as i32));
    let order_id = world
        .shopping
        .orders
        .keys()
        .next_back()
        .map_or(1, |k| k + 1);
    world.shopping.orders.insert(
        order_id,
        Order {
            date: order_date,
            items: vec![OrderItem {
                product_name: product.clone(),
                quantity: 1,
                price_cents: price,
            }],
        },
    );
    let id = world
        .shopping
        .returns
        .keys()
        .next_back()
        .map_or(1, |k| k + 1);
    world.shopping.returns.insert(
        id,
        Return {
            order_id,
            product_name: product,
            returned_at,
            refund_cents: price,
        },
    );
    id
}

/// Add a transaction.
pub fn add_transaction(world: &mut World, t: Transaction) -> u32 {
    let id = world
        .payments
        .transactions
        .keys()
        .next_back()
        .map_or(1, |k| k + 1);
    world.payments.transactions.insert(id, t);
    id
}

/// A random received or sent transaction with a contact.
pub fn random_transaction(g: &mut Gen, world: &World, date: Date) -> Transaction {
    let who = g.pick(&world.contacts).clone();
    let direction = if g.chance(0.5) {
        Direction::Received
    } else {
        Direction::Sent
    };
    let amount = g.price(5, 120);
    Transaction {
        date,
        counterparty: who.email.clone(),
        counterparty_name: who.full_name(),
        amount_cents: amount,
        fee_cents: if direction == Direction::Sent {
            super::apps::payments::fee(amount, world.payments.fee_bps)
        } else {
            0
        },
        direction,
        note: g.pick(NOTES).to_string(),
    }
}

/// A payment note.
pub fn note(g: &mut Gen) -> String {
    g.pick(NOTES).to_string()
}

/// The base world of `seed`.
pub fn base_world(g: &mut Gen) -> World {
    let year = 2023 + g.int(0, 2) as i32;
    let now = Date::from_ymd(year, g.int(1, 12) as u32, g.int(10, 28) as u32);
    let mut everyone = people(g, 21);
    let user = everyone.remove(0);
    let mut world = World {
        now,
        contacts: everyone,
        mail: MailApp::default(),
        music: MusicApp::default(),
        payments: PaymentsApp {
            account: Account {
                email: user.email.clone(),
                password: String::new(),
            },
            balance_cents: g.price(800, 4000),
            fee_bps: *g.pick(&[100, 150, 200, 250]),
            transactions: BTreeMap::new(),
        },
        shopping: ShoppingApp {
            account: Account {
                email: user.email.clone(),
                password: String::new(),
            },
            orders: BTreeMap::new(),
            returns: BTreeMap::new(),
        },
        supervisor: SupervisorApp {
            profile: user,
            passwords: BTreeMap::new(),
        },
    };
    world.payments.account.password = g.password();
    world.shopping.account.password = g.password();
    world
        .supervisor
        .passwords
        .insert("payments".into(), world.payments.account.password.clone());
    world
        .supervisor
        .passwords
        .insert("shopping".into(), world.shopping.account.password.clone());

    for (folder, lo, hi) in [
        (Folder::Inbox, 6, 9),
        (Folder::Spam, 3, 6),
        (Folder::Archive, 4, 7),
        (Folder::Sent, 3, 5),
    ] {
        for _ in 0..g.size(lo, hi) {
            let email = random_email(g, &world, folder);
            add_email(&mut world, email);
        }
    }

    for _ in 0..60 {
        let song = new_song(g, &world, None, None);
        add_song(&mut world, song);
    }
    let mut ids: Vec<u32> = world.music.songs.keys().copied().collect();
    g.shuffle(&mut ids);
    let mut library: Vec<u32> = ids[..25].to_vec();
    library.sort_unstable();
    world.music.library = library;
    g.shuffle(&mut ids);
    world.music.liked = ids[..6].to_vec();
    let mut names = PLAYLIST_NAMES.to_vec();
    g.shuffle(&mut names);
    for (i, name) in names.iter().take(4).enumerate() {
        g.shuffle(&mut ids);
        let n = g.size(4, 8);
        world.music.playlists.insert(
            i as u32 + 1,
            Playlist {
                name: name.to_string(),
                song_ids: ids[..n].to_vec(),
            },
        );
    }

    for _ in 0..g.size(8, 12) {
        let date = now.plus_days(-(g.int(0, 90) as i32));
        let t = random_transaction(g, &world, date);
        add_transaction(&mut world, t);
    }

    // Orders are at least a day old, so a task may plant today's order as the unique latest.
    for _ in 0..g.size(5, 8) {
        let date = now.plus_days(-(g.int(1, 200) as i32));
        let mut items = Vec::new();
        for _ in 0..g.size(1, 3) {
            let noun = other_noun(g, "");
            items.push(OrderItem {
                product_name: product_name(g, noun),
                quantity: g.int(1, 2) as u32,
                price_cents: g.price(8, 300),
            });
        }
        let id = world
            .shopping
            .orders
            .keys()
            .next_back()
            .map_or(1, |k| k + 1);
        world.shopping.orders.insert(id, Order { date, items });
    }
    world
}

/// Unused names of the pool, for planting a playlist.
pub fn fresh_playlist_name(g: &mut Gen, world: &World) -> String {
    let used: BTreeSet<&str> = world
        .music
        .playlists
        .values()
        .map(|p| p.name.as_str())
        .collect();
    let free: Vec<&str> = PLAYLIST_NAMES
        .iter()
        .copied()
        .filter(|n| !used.contains(n))
        .collect();
    if free.is_empty() {
        format!("Mix {}", g.int(100, 999))
    } else {
        g.pick(&free).to_string()
    }
}
