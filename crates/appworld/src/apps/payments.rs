//! The payments app: balance, transactions and sending money.

use serde_json::{Value, json};

use super::super::world::{Direction, Transaction, World};
use super::{Args, Reply, Runtime, account, cents, dollars, paginate};

/// Transactions newest first (ties: higher id first).
pub fn transaction_listing(world: &World) -> Vec<(u32, &Transaction)> {
    let mut items: Vec<(u32, &Transaction)> = world
        .payments
        .transactions
        .iter()
        .map(|(id, t)| (*id, t))
        .collect();
    items.sort_by(|a, b| b.1.date.cmp(&a.1.date).then(b.0.cmp(&a.0)));
    items
}

fn summary(id: u32, t: &Transaction) -> Value {
    json!({
        "transaction_id": id,
        "date": t.date,
        "direction": t.direction,
        "counterparty_name": t.counterparty_name,
        "counterparty": t.counterparty,
        "amount": dollars(t.amount_cents),
        "note": t.note,
    })
}

/// The fee on sending `amount_cents` at `fee_bps` basis points, rounded to the nearest cent.
pub fn fee(amount_cents: i64, fee_bps: i64) -> i64 {
    (amount_cents * fee_bps + 5_000) / 10_000
}

pub(super) fn call(
    world: &mut World,
    rt: &mut Runtime,
    api: &str,
    args: &Args<'_>,
    paging: Option<(usize, usize)>,
    multi_page: &mut bool,
) -> Reply {
    if let Some(reply) = account::call(world, rt, "payments", api, args) {
        return reply;
    }
    match api {
        "show_balance" => Ok(json!({"balance": dollars(world.payments.balance_cents)})),
        "list_transactions" => {
            let (page, size) = paging.unwrap_or((1, super::DEFAULT_PAGE_SIZE));
            let all: Vec<Value> = transaction_listing(world)
                .into_iter()
                .map(|(id, t)| summary(id, t))
                .collect();
            let (items, multi) = paginate(&all, page, size);
            *multi_page = multi;
            Ok(json!({"page": page, "page_size": size, "transactions": items}))
        }
        "show_transaction" => {
            let id = args.id("transaction_id");
            let t = id
                .and_then(|id| world.payments.transactions.get(&id))
                .ok_or_else(|| {
                    format!(
                        "No transaction with id {}.",
                        args.int("transaction_id").unwrap_or(-1)
                    )
                })?;
            let mut value = summary(id.unwrap_or_default(), t);
            value["fee"] = dollars(t.fee_cents);
            Ok(value)
        }
        "send_money" => {
            let to = args.str("to_email").trim().to_string();
            if to.eq_ignore_ascii_case(&world.payments.account.email) {
                return Err("You cannot send money to yourself.".into());
            }
            let Some(name) = world.name_of(&to) else {
                return Err(format!(
                    "No payments user has the email `{}`.",
                    super::truncate(&to, 80)
                ));
            };
            let amount = args
                .num("amount")
                .and_then(cents)
                .filter(|c| *c > 0)
                .ok_or(
                    "`amount` must be a positive number of dollars with at most two decimals.",
                )?;
            let fee = fee(amount, world.payments.fee_bps);
            if amount + fee > world.payments.balance_cents {
                return Err("Insufficient balance for this payment and its fee.".into());
            }
            let note = args.str("note").trim().to_string();
            if note.chars().count() > 200 {
                return Err("`note` must have at most 200 characters.".into());
            }
            let id = world
                .payments
                .transactions
                .keys()
                .next_back()
                .map_or(1, |k| k + 1);
            world.payments.balance_cents -= amount + fee;
            world.payments.transactions.insert(
                id,
                Transaction {
                    date: world.now,
                    counterparty: to.to_lowercase(),
                    counterparty_name: name,
                    amount_cents: amount,
                    fee_cents: fee,
                    direction: Direction::Sent,
                    note,
                },
            );
            Ok(json!({"transaction_id": id, "message": "Payment sent."}))
        }
        _ => Err(format!("The app `payments` has no API `{api}`.")),
    }
}
