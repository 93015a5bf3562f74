//! The retail domain's sixteen tools: their schemas and what each one reads or writes.
//!
//! The semantics are the benchmark's (tau2-bench, `src/tau2/domains/retail/tools.py` at the
//! commit `SOURCE.md` names), checked against it tool by tool: the same checks in the same
//! order with the same error texts, the same fields written, and the same float arithmetic
//! (Python's `round(x, 2)` is reproduced exactly by [`py_round2`]). Two of the benchmark's
//! quirks are kept on purpose, because the reward compares databases with the ones its
//! implementation leaves:
//! - `modify_pending_order_items` gives every modified item the price and options of the
//!   *last* new item of the call, and records the unrounded price difference as the payment;
//! - `modify_pending_order_address` and `modify_pending_order_payment` accept any status that
//!   contains `pending` (so `pending (item modified)` too), while cancelling and modifying items
//!   need exactly `pending`.
//!
//! One difference is deliberate: `calculate` evaluates the expression with its own small
//! evaluator of Python's arithmetic, so a malformed expression's error says `invalid syntax`
//! where Python's parser names the exact problem.
//!
//! A successful call returns the record as JSON (keys sorted, written as Python's `json.dumps`
//! writes them), a plain string (`find_user_id_*`, `calculate`, `transfer_to_human_agents`) or
//! a JSON object of names to ids (`list_all_product_types`); a failed one returns the
//! benchmark's message, which the session shows as `Error: <message>`.

use std::collections::BTreeMap;

use harness_core::{ToolKind, ToolSpec};
use serde_json::{Map, Value, json};

use super::db::{Address, Order, Payment, PaymentMethod, RetailDb, Variant};

/// Tool names.
pub mod name {
    /// Arithmetic on numbers.
    pub const CALCULATE: &str = "calculate";
    /// Cancel a pending order.
    pub const CANCEL_PENDING_ORDER: &str = "cancel_pending_order";
    /// Exchange items of a delivered order.
    pub const EXCHANGE_DELIVERED_ORDER_ITEMS: &str = "exchange_delivered_order_items";
    /// A user id from first name, last name and zip.
    pub const FIND_USER_ID_BY_NAME_ZIP: &str = "find_user_id_by_name_zip";
    /// A user id from an email address.
    pub const FIND_USER_ID_BY_EMAIL: &str = "find_user_id_by_email";
    /// An order's details.
    pub const GET_ORDER_DETAILS: &str = "get_order_details";
    /// A product's details with its variants.
    pub const GET_PRODUCT_DETAILS: &str = "get_product_details";
    /// One item's details.
    pub const GET_ITEM_DETAILS: &str = "get_item_details";
    /// A user's profile.
    pub const GET_USER_DETAILS: &str = "get_user_details";
    /// Every product's name and id.
    pub const LIST_ALL_PRODUCT_TYPES: &str = "list_all_product_types";
    /// Change a pending order's shipping address.
    pub const MODIFY_PENDING_ORDER_ADDRESS: &str = "modify_pending_order_address";
    /// Change items of a pending order.
    pub const MODIFY_PENDING_ORDER_ITEMS: &str = "modify_pending_order_items";
    /// Change a pending order's payment method.
    pub const MODIFY_PENDING_ORDER_PAYMENT: &str = "modify_pending_order_payment";
    /// Change a user's default address.
    pub const MODIFY_USER_ADDRESS: &str = "modify_user_address";
    /// Return items of a delivered order.
    pub const RETURN_DELIVERED_ORDER_ITEMS: &str = "return_delivered_order_items";
    /// Hand the customer over to a human agent.
    pub const TRANSFER_TO_HUMAN_AGENTS: &str = "transfer_to_human_agents";
}

use name::*;

/// The tools that change the database.
pub const WRITE_TOOLS: [&str; 7] = [
    CANCEL_PENDING_ORDER,
    EXCHANGE_DELIVERED_ORDER_ITEMS,
    MODIFY_PENDING_ORDER_ADDRESS,
    MODIFY_PENDING_ORDER_ITEMS,
    MODIFY_PENDING_ORDER_PAYMENT,
    MODIFY_USER_ADDRESS,
    RETURN_DELIVERED_ORDER_ITEMS,
];

/// The tools that read the database.
pub const READ_TOOLS: [&str; 7] = [
    FIND_USER_ID_BY_EMAIL,
    FIND_USER_ID_BY_NAME_ZIP,
    GET_ITEM_DETAILS,
    GET_ORDER_DETAILS,
    GET_PRODUCT_DETAILS,
    GET_USER_DETAILS,
    LIST_ALL_PRODUCT_TYPES,
];

/// The lookups that authenticate a customer.
pub const AUTH_TOOLS: [&str; 2] = [FIND_USER_ID_BY_EMAIL, FIND_USER_ID_BY_NAME_ZIP];

/// Whether `tool` changes the database.
pub fn is_write(tool: &str) -> bool {
    WRITE_TOOLS.contains(&tool)
}

/// Whether `tool` reads the database.
pub fn is_read(tool: &str) -> bool {
    READ_TOOLS.contains(&tool)
}

fn string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn strings(description: &str) -> Value {
    json!({"type": "array", "items": {"type": "string"}, "description": description})
}

fn schema(properties: Vec<(&str, Value)>) -> Value {
    let required: Vec<&str> = properties.iter().map(|(n, _)| *n).collect();
    let properties: Map<String, Value> = properties
        .into_iter()
        .map(|(n, v)| (n.to_string(), v))
        .collect();
    json!({"type": "object", "properties": properties, "required": required})
}

const ORDER_ID: &str = "The order id, with its leading '#', e.g. '#W0000000'.";
const PAYMENT_ID: &str =
    "A payment method id of the user, e.g. 'gift_card_0000000' or 'credit_card_0000000'.";

fn address_properties(first: (&str, Value)) -> Vec<(&str, Value)> {
    vec![
        first,
        (
            "address1",
            string("First address line, e.g. '123 Main St'."),
        ),
        (
            "address2",
            string("Second address line, e.g. 'Apt 1', or ''."),
        ),
        ("city", string("City.")),
        ("state", string("State, e.g. 'CA'.")),
        ("country", string("Country, e.g. 'USA'.")),
        ("zip", string("Zip code, e.g. '12345'.")),
    ]
}

/// The sixteen domain tools, in name order. `transfer_to_human_agents` is a submit tool: it
/// ends the conversation.
pub fn domain_tool_specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            CALCULATE,
            "Evaluate an arithmetic expression of numbers, + - * /, parentheses and spaces; the result is rounded to 2 decimals.",
            schema(vec![("expression", string("The expression, e.g. '(54.04 - 12.5) * 2'."))]),
        ),
        ToolSpec::new(
            CANCEL_PENDING_ORDER,
            "Cancel a pending order and refund its payments (to a gift card at once, otherwise in 5-7 business days). Only after the user confirmed the details explicitly.",
            schema(vec![
                ("order_id", string(ORDER_ID)),
                ("reason", string("'no longer needed' or 'ordered by mistake'.")),
            ]),
        ),
        ToolSpec::new(
            EXCHANGE_DELIVERED_ORDER_ITEMS,
            "Request the exchange of items of a delivered order for other variants of the same products; the price difference is paid or refunded with the given method. Possible once per order, only after the user confirmed the details explicitly.",
            schema(vec![
                ("order_id", string(ORDER_ID)),
                ("item_ids", strings("The item ids to exchange; an item may appear more than once.")),
                ("new_item_ids", strings("The new item ids, position by position, each a variant of the same product as the item it replaces.")),
                ("payment_method_id", string(PAYMENT_ID)),
            ]),
        ),
        ToolSpec::new(
            FIND_USER_ID_BY_EMAIL,
            "Find a user id from an email address.",
            schema(vec![("email", string("The email address, e.g. 'name@example.com'."))]),
        ),
        ToolSpec::new(
            FIND_USER_ID_BY_NAME_ZIP,
            "Find a user id from first name, last name and zip code (when the user cannot give an email).",
            schema(vec![
                ("first_name", string("First name, e.g. 'John'.")),
                ("last_name", string("Last name, e.g. 'Doe'.")),
                ("zip", string("Zip code, e.g. '12345'.")),
            ]),
        ),
        ToolSpec::new(
            GET_ITEM_DETAILS,
            "Show one item (a product variant): options, availability and price.",
            schema(vec![("item_id", string("The item id, e.g. '1008292230' (not a product id)."))]),
        ),
        ToolSpec::new(
            GET_ORDER_DETAILS,
            "Show an order: status, items, address, fulfillments and payments.",
            schema(vec![("order_id", string(ORDER_ID))]),
        ),
        ToolSpec::new(
            GET_PRODUCT_DETAILS,
            "Show a product with all its variant items (options, availability, price).",
            schema(vec![("product_id", string("The product id, e.g. '6086499569' (not an item id)."))]),
        ),
        ToolSpec::new(
            GET_USER_DETAILS,
            "Show a user's profile: name, address, email, payment methods and order ids.",
            schema(vec![("user_id", string("The user id, e.g. 'sara_doe_496'."))]),
        ),
        ToolSpec::new(
            LIST_ALL_PRODUCT_TYPES,
            "List the names and product ids of the store's 50 product types.",
            schema(vec![]),
        ),
        ToolSpec::new(
            MODIFY_PENDING_ORDER_ADDRESS,
            "Change the shipping address of a pending order. Only after the user confirmed the details explicitly.",
            schema(address_properties(("order_id", string(ORDER_ID)))),
        ),
        ToolSpec::new(
            MODIFY_PENDING_ORDER_ITEMS,
            "Change items of a pending order to other variants of the same products; the price difference is paid or refunded with the given method. Possible once per order, only after the user confirmed the details explicitly.",
            schema(vec![
                ("order_id", string(ORDER_ID)),
                ("item_ids", strings("The item ids to change; an item may appear more than once.")),
                ("new_item_ids", strings("The new item ids, position by position, each a different variant of the same product.")),
                ("payment_method_id", string(PAYMENT_ID)),
            ]),
        ),
        ToolSpec::new(
            MODIFY_PENDING_ORDER_PAYMENT,
            "Pay a pending order with another of the user's payment methods (the old one is refunded). Only after the user confirmed the details explicitly.",
            schema(vec![
                ("order_id", string(ORDER_ID)),
                ("payment_method_id", string(PAYMENT_ID)),
            ]),
        ),
        ToolSpec::new(
            MODIFY_USER_ADDRESS,
            "Change a user's default address. Only after the user confirmed the details explicitly.",
            schema(address_properties(("user_id", string("The user id, e.g. 'sara_doe_496'.")))),
        ),
        ToolSpec::new(
            RETURN_DELIVERED_ORDER_ITEMS,
            "Request the return of items of a delivered order; the refund goes to the original payment method or to a gift card of the user. Possible once per order, only after the user confirmed the details explicitly.",
            schema(vec![
                ("order_id", string(ORDER_ID)),
                ("item_ids", strings("The item ids to return; an item may appear more than once.")),
                ("payment_method_id", string(PAYMENT_ID)),
            ]),
        ),
        ToolSpec::new(
            TRANSFER_TO_HUMAN_AGENTS,
            "Hand the user over to a human agent with a summary of the issue, only when the user asks for one or the request cannot be handled with these tools under the policy. Ends the conversation.",
            schema(vec![("summary", string("A summary of the user's issue."))]),
        )
        .with_kind(ToolKind::Submit),
    ]
}

/// The arguments of one call, checked against the tool's parameter list.
struct Args<'a> {
    tool: &'a str,
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    fn new(tool: &'a str, value: &'a Value, allowed: &[&str]) -> Result<Self, String> {
        let Value::Object(map) = value else {
            return Err(format!(
                "the arguments of {tool} must be a JSON object with: {}",
                allowed.join(", ")
            ));
        };
        if let Some(extra) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            let extra: String = extra.chars().take(60).collect();
            return Err(format!(
                "{tool} got an unexpected argument '{extra}'; it takes: {}",
                if allowed.is_empty() {
                    "no arguments".to_string()
                } else {
                    allowed.join(", ")
                }
            ));
        }
        if let Some(missing) = allowed.iter().find(|k| !map.contains_key(**k)) {
            return Err(format!("{tool} is missing the argument '{missing}'"));
        }
        Ok(Args { tool, map })
    }

    fn str(&self, key: &str) -> Result<&'a str, String> {
        match self.map.get(key) {
            Some(Value::String(s)) => Ok(s),
            _ => Err(format!("{}: '{key}' must be a string", self.tool)),
        }
    }

    fn strs(&self, key: &str) -> Result<Vec<String>, String> {
        match self.map.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(format!("{}: '{key}' must be a list of strings", self.tool)),
                })
                .collect(),
            _ => Err(format!("{}: '{key}' must be a list of strings", self.tool)),
        }
    }

    fn address(&self) -> Result<Address, String> {
        Ok(Address {
            address1: self.str("address1")?.to_string(),
            address2: self.str("address2")?.to_string(),
            city: self.str("city")?.to_string(),
            country: self.str("country")?.to_string(),
            state: self.str("state")?.to_string(),
            zip: self.str("zip")?.to_string(),
        })
    }
}

const ADDRESS_KEYS: [&str; 6] = ["address1", "address2", "city", "state", "country", "zip"];

/// Run one tool call on `db`. `Ok` is the observation text, `Err` the error message (without
/// the `Error: ` prefix the session adds). A failed call leaves `db` as it was, except where
/// the benchmark itself writes before it fails (a payment method missing from the user's
/// profile part way through a cancellation or a payment change).
pub fn call(db: &mut RetailDb, tool: &str, arguments: &Value) -> Result<String, String> {
    let with = |allowed: &[&str]| Args::new(tool, arguments, allowed);
    match tool {
        CALCULATE => calculate(with(&["expression"])?.str("expression")?),
        CANCEL_PENDING_ORDER => {
            let a = with(&["order_id", "reason"])?;
            cancel_pending_order(db, a.str("order_id")?, a.str("reason")?)
        }
        EXCHANGE_DELIVERED_ORDER_ITEMS => {
            let a = with(&["order_id", "item_ids", "new_item_ids", "payment_method_id"])?;
            exchange_delivered_order_items(
                db,
                a.str("order_id")?,
                &a.strs("item_ids")?,
                &a.strs("new_item_ids")?,
                a.str("payment_method_id")?,
            )
        }
        FIND_USER_ID_BY_EMAIL => {
            let email = with(&["email"])?.str("email")?.to_lowercase();
            db.users
                .values()
                .find(|u| u.email.to_lowercase() == email)
                .map(|u| u.user_id.clone())
                .ok_or_else(|| "User not found".to_string())
        }
        FIND_USER_ID_BY_NAME_ZIP => {
            let a = with(&["first_name", "last_name", "zip"])?;
            let (first, last, zip) = (
                a.str("first_name")?.to_lowercase(),
                a.str("last_name")?.to_lowercase(),
                a.str("zip")?,
            );
            db.users
                .values()
                .find(|u| {
                    u.name.first_name.to_lowercase() == first
                        && u.name.last_name.to_lowercase() == last
                        && u.address.zip == zip
                })
                .map(|u| u.user_id.clone())
                .ok_or_else(|| "User not found".to_string())
        }
        GET_ORDER_DETAILS => {
            let id = with(&["order_id"])?.str("order_id")?;
            Ok(py_json_of(find_order(db, id)?))
        }
        GET_PRODUCT_DETAILS => {
            let id = with(&["product_id"])?.str("product_id")?;
            let product = db
                .products
                .get(id)
                .ok_or_else(|| "Product not found".to_string())?;
            Ok(py_json_of(product))
        }
        GET_ITEM_DETAILS => {
            let id = with(&["item_id"])?.str("item_id")?;
            let item = db
                .products
                .values()
                .find_map(|p| p.variants.get(id))
                .ok_or_else(|| "Item not found".to_string())?;
            Ok(py_json_of(item))
        }
        GET_USER_DETAILS => {
            let id = with(&["user_id"])?.str("user_id")?;
            let user = db
                .users
                .get(id)
                .ok_or_else(|| "User not found".to_string())?;
            Ok(py_json_of(user))
        }
        LIST_ALL_PRODUCT_TYPES => {
            with(&[])?;
            let names: BTreeMap<&str, &str> = db
                .products
                .values()
                .map(|p| (p.name.as_str(), p.product_id.as_str()))
                .collect();
            Ok(py_json(&json!(names)))
        }
        MODIFY_PENDING_ORDER_ADDRESS => {
            let mut keys = vec!["order_id"];
            keys.extend(ADDRESS_KEYS);
            let a = with(&keys)?;
            let address = a.address()?;
            let order = order_mut(db, a.str("order_id")?)?;
            if !order.status.contains("pending") {
                return Err("Non-pending order cannot be modified".into());
            }
            order.address = address;
            Ok(py_json_of(&*order))
        }
        MODIFY_PENDING_ORDER_ITEMS => {
            let a = with(&["order_id", "item_ids", "new_item_ids", "payment_method_id"])?;
            modify_pending_order_items(
                db,
                a.str("order_id")?,
                &a.strs("item_ids")?,
                &a.strs("new_item_ids")?,
                a.str("payment_method_id")?,
            )
        }
        MODIFY_PENDING_ORDER_PAYMENT => {
            let a = with(&["order_id", "payment_method_id"])?;
            modify_pending_order_payment(db, a.str("order_id")?, a.str("payment_method_id")?)
        }
        MODIFY_USER_ADDRESS => {
            let mut keys = vec!["user_id"];
            keys.extend(ADDRESS_KEYS);
            let a = with(&keys)?;
            let address = a.address()?;
            let user = db
                .users
                .get_mut(a.str("user_id")?)
                .ok_or_else(|| "User not found".to_string())?;
            user.address = address;
            Ok(py_json_of(&*user))
        }
        RETURN_DELIVERED_ORDER_ITEMS => {
            let a = with(&["order_id", "item_ids", "payment_method_id"])?;
            return_delivered_order_items(
                db,
                a.str("order_id")?,
                &a.strs("item_ids")?,
                a.str("payment_method_id")?,
            )
        }
        TRANSFER_TO_HUMAN_AGENTS => {
            with(&["summary"])?.str("summary")?;
            Ok("Transfer successful".into())
        }
        other => Err(format!("Tool '{}' not found.", cut(other, 60))),
    }
}

fn cut(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

fn find_order<'a>(db: &'a RetailDb, id: &str) -> Result<&'a Order, String> {
    db.orders
        .get(id)
        .ok_or_else(|| "Order not found".to_string())
}

fn order_mut<'a>(db: &'a mut RetailDb, id: &str) -> Result<&'a mut Order, String> {
    db.orders
        .get_mut(id)
        .ok_or_else(|| "Order not found".to_string())
}

fn payment_method<'a>(
    db: &'a RetailDb,
    user_id: &str,
    method_id: &str,
) -> Result<&'a PaymentMethod, String> {
    let user = db
        .users
        .get(user_id)
        .ok_or_else(|| "User not found".to_string())?;
    user.payment_methods
        .get(method_id)
        .ok_or_else(|| "Payment method not found".to_string())
}

fn gift_card_balance_mut<'a>(
    db: &'a mut RetailDb,
    user_id: &str,
    method_id: &str,
) -> Option<&'a mut f64> {
    match db
        .users
        .get_mut(user_id)?
        .payment_methods
        .get_mut(method_id)?
    {
        PaymentMethod::GiftCard { balance, .. } => Some(balance),
        _ => None,
    }
}

fn variant<'a>(db: &'a RetailDb, product_id: &str, item_id: &str) -> Result<&'a Variant, String> {
    let product = db
        .products
        .get(product_id)
        .ok_or_else(|| "Product not found".to_string())?;
    product
        .variants
        .get(item_id)
        .ok_or_else(|| "Variant not found".to_string())
}

/// Each id must occur in `ids` no more often than among the order's items.
fn check_counts(
    order: &Order,
    ids: &[String],
    message: impl Fn(&str) -> String,
) -> Result<(), String> {
    for id in ids {
        let wanted = ids.iter().filter(|i| *i == id).count();
        let present = order.items.iter().filter(|i| i.item_id == *id).count();
        if wanted > present {
            return Err(message(id));
        }
    }
    Ok(())
}

fn cancel_pending_order(db: &mut RetailDb, order_id: &str, reason: &str) -> Result<String, String> {
    let order = find_order(db, order_id)?;
    if order.status != "pending" {
        return Err("Non-pending order cannot be cancelled".into());
    }
    if reason != "no longer needed" && reason != "ordered by mistake" {
        return Err("Invalid reason".into());
    }
    let user_id = order.user_id.clone();
    let payments = order.payment_history.clone();
    let mut refunds = Vec::new();
    for payment in &payments {
        refunds.push(Payment {
            transaction_type: "refund".into(),
            amount: payment.amount,
            payment_method_id: payment.payment_method_id.clone(),
        });
        // As in the benchmark, a missing method fails the call after the refunds to earlier
        // gift cards were made.
        payment_method(db, &user_id, &payment.payment_method_id)?;
        if let Some(balance) = gift_card_balance_mut(db, &user_id, &payment.payment_method_id) {
            *balance = py_round2(*balance + payment.amount);
        }
    }
    let order = order_mut(db, order_id)?;
    order.status = "cancelled".into();
    order.cancel_reason = Some(reason.to_string());
    order.payment_history.extend(refunds);
    Ok(py_json_of(&*order))
}

fn exchange_delivered_order_items(
    db: &mut RetailDb,
    order_id: &str,
    item_ids: &[String],
    new_item_ids: &[String],
    method_id: &str,
) -> Result<String, String> {
    let order = find_order(db, order_id)?;
    if order.status != "delivered" {
        return Err("Non-delivered order cannot be exchanged".into());
    }
    check_counts(order, item_ids, |id| format!("Number of {id} not found."))?;
    if item_ids.len() != new_item_ids.len() {
        return Err("The number of items to be exchanged should match.".into());
    }
    let mut diff = 0.0;
    for (item_id, new_item_id) in item_ids.iter().zip(new_item_ids) {
        let item = order
            .items
            .iter()
            .find(|i| i.item_id == *item_id)
            .ok_or_else(|| format!("Item {item_id} not found"))?;
        let variant = variant(db, &item.product_id, new_item_id)?;
        if !variant.available {
            return Err(format!("New item {new_item_id} not found or available"));
        }
        diff += variant.price - item.price;
    }
    let diff = py_round2(diff);
    let user_id = order.user_id.clone();
    if let PaymentMethod::GiftCard { balance, .. } = payment_method(db, &user_id, method_id)?
        && *balance < diff
    {
        return Err("Insufficient gift card balance to pay for the price difference".into());
    }
    let order = order_mut(db, order_id)?;
    order.status = "exchange requested".into();
    order.exchange_items = Some(sorted(item_ids));
    order.exchange_new_items = Some(sorted(new_item_ids));
    order.exchange_payment_method_id = Some(method_id.to_string());
    order.exchange_price_difference = Some(diff);
    Ok(py_json_of(&*order))
}

fn modify_pending_order_items(
    db: &mut RetailDb,
    order_id: &str,
    item_ids: &[String],
    new_item_ids: &[String],
    method_id: &str,
) -> Result<String, String> {
    let order = find_order(db, order_id)?;
    if order.status != "pending" {
        return Err("Non-pending order cannot be modified".into());
    }
    check_counts(order, item_ids, |id| format!("{id} not found"))?;
    if item_ids.len() != new_item_ids.len() {
        return Err("The number of items to be exchanged should match".into());
    }
    let mut diff = 0.0;
    let mut last_variant: Option<Variant> = None;
    for (item_id, new_item_id) in item_ids.iter().zip(new_item_ids) {
        if item_id == new_item_id {
            return Err("The new item id should be different from the old item id".into());
        }
        let item = order
            .items
            .iter()
            .find(|i| i.item_id == *item_id)
            .ok_or_else(|| format!("Item {item_id} not found"))?;
        let variant = variant(db, &item.product_id, new_item_id)?;
        if !variant.available {
            return Err(format!("New item {new_item_id} not found or available"));
        }
        diff += variant.price - item.price;
        last_variant = Some(variant.clone());
    }
    let user_id = order.user_id.clone();
    if let PaymentMethod::GiftCard { balance, .. } = payment_method(db, &user_id, method_id)?
        && *balance < diff
    {
        return Err("Insufficient gift card balance to pay for the new item".into());
    }
    if let Some(balance) = gift_card_balance_mut(db, &user_id, method_id) {
        *balance = py_round2(*balance - diff);
    }
    let order = order_mut(db, order_id)?;
    order.payment_history.push(Payment {
        transaction_type: if diff > 0.0 { "payment" } else { "refund" }.into(),
        amount: diff.abs(),
        payment_method_id: method_id.to_string(),
    });
    for (item_id, new_item_id) in item_ids.iter().zip(new_item_ids) {
        let Some(item) = order.items.iter_mut().find(|i| i.item_id == *item_id) else {
            return Err(format!("Item {item_id} not found"));
        };
        item.item_id = new_item_id.clone();
        // The benchmark's quirk: price and options come from the last new item of the call.
        if let Some(variant) = &last_variant {
            item.price = variant.price;
            item.options = variant.options.clone();
        }
    }
    order.status = "pending (item modified)".into();
    Ok(py_json_of(&*order))
}

fn modify_pending_order_payment(
    db: &mut RetailDb,
    order_id: &str,
    method_id: &str,
) -> Result<String, String> {
    let order = find_order(db, order_id)?;
    if !order.status.contains("pending") {
        return Err("Non-pending order cannot be modified".into());
    }
    let user_id = order.user_id.clone();
    let new_method = payment_method(db, &user_id, method_id)?;
    if order.payment_history.len() != 1 || order.payment_history[0].transaction_type != "payment" {
        return Err("There should be exactly one payment for a pending order".into());
    }
    let old_method_id = order.payment_history[0].payment_method_id.clone();
    if old_method_id == method_id {
        return Err("The new payment method should be different from the current one".into());
    }
    let amount = order.payment_history[0].amount;
    if let PaymentMethod::GiftCard { balance, .. } = new_method
        && *balance < amount
    {
        return Err("Insufficient gift card balance to pay for the order".into());
    }
    // The benchmark looks the old method up only after writing the payments, so an order paid
    // with a method the user no longer has fails after the new one was charged; keep that.
    {
        let order = order_mut(db, order_id)?;
        order.payment_history.push(Payment {
            transaction_type: "payment".into(),
            amount,
            payment_method_id: method_id.to_string(),
        });
        order.payment_history.push(Payment {
            transaction_type: "refund".into(),
            amount,
            payment_method_id: old_method_id.clone(),
        });
    }
    if let Some(balance) = gift_card_balance_mut(db, &user_id, method_id) {
        *balance = py_round2(*balance - amount);
    }
    payment_method(db, &user_id, &old_method_id)?;
    if let Some(balance) = gift_card_balance_mut(db, &user_id, &old_method_id) {
        *balance = py_round2(*balance + amount);
    }
    Ok(py_json_of(find_order(db, order_id)?))
}

fn return_delivered_order_items(
    db: &mut RetailDb,
    order_id: &str,
    item_ids: &[String],
    method_id: &str,
) -> Result<String, String> {
    let order = find_order(db, order_id)?;
    if order.status != "delivered" {
        return Err("Non-delivered order cannot be returned".into());
    }
    let method = payment_method(db, &order.user_id, method_id)?;
    let original = order
        .payment_history
        .first()
        .map(|p| p.payment_method_id.as_str());
    if !matches!(method, PaymentMethod::GiftCard { .. }) && original != Some(method_id) {
        return Err("Payment method should be the original payment method".into());
    }
    check_counts(order, item_ids, |_| "Some item not found".to_string())?;
    let order = order_mut(db, order_id)?;
    order.status = "return requested".into();
    order.return_items = Some(sorted(item_ids));
    order.return_payment_method_id = Some(method_id.to_string());
    Ok(py_json_of(&*order))
}

fn sorted(ids: &[String]) -> Vec<String> {
    let mut ids = ids.to_vec();
    ids.sort();
    ids
}

/// Python's `round(x, 2)`: the decimal nearest to the exact binary value, ties to even.
/// Rust's fixed-precision formatting rounds the exact value the same way, and parsing the
/// digits back gives the float Python returns.
pub fn py_round2(x: f64) -> f64 {
    if !x.is_finite() {
        return x;
    }
    format!("{x:.2}").parse().unwrap_or(x)
}

/// Python's `repr` of a float (`54.04`, `100.0`, `1e+16`, `1.5e-05`).
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // `{:e}` gives the shortest digits that round-trip, as Python's repr uses.
    let sci = format!("{x:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exponent) {
        let point = exponent + 1;
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if digits.len() as i32 <= point {
            format!(
                "{digits}{}.0",
                "0".repeat((point - digits.len() as i32) as usize)
            )
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{first}{fraction}e{esign}{:02}", exponent.abs())
    }
}

fn py_json_of<T: serde::Serialize>(value: &T) -> String {
    py_json(&serde_json::to_value(value).unwrap_or(Value::Null))
}

/// JSON as Python's `json.dumps` writes it (`", "` and `": "` separators, non-ASCII escaped,
/// floats in Python's repr); object keys in the value's order (sorted here).
pub fn py_json(value: &Value) -> String {
    let mut out = String::new();
    write_py_json(value, &mut out);
    out
}

fn write_py_json(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) if !n.is_f64() => out.push_str(&i.to_string()),
            (_, Some(u), _) if !n.is_f64() => out.push_str(&u.to_string()),
            (_, _, Some(f)) => out.push_str(&py_float_repr(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => write_py_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_string(key, out);
                out.push_str(": ");
                write_py_json(item, out);
            }
            out.push('}');
        }
    }
}

fn write_py_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A number while evaluating `calculate`: Python keeps integers exact until a division.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn float(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

/// The `calculate` tool: the benchmark evaluates the expression as Python would (after
/// checking its characters); this is a small evaluator of the same grammar: numbers, unary
/// `+`/`-`, `+ - * / // **` and parentheses.
pub fn calculate(expression: &str) -> Result<String, String> {
    if !expression.chars().all(|c| "0123456789+-*/(). ".contains(c)) {
        return Err("Invalid characters in expression".into());
    }
    let tokens = tokenize(expression)?;
    let mut parser = Calc { tokens, at: 0 };
    let value = parser.sum()?;
    if parser.at != parser.tokens.len() {
        return Err("invalid syntax".into());
    }
    let value = value.float();
    if !value.is_finite() {
        return Err("math range error".into());
    }
    Ok(py_float_repr(py_round2(value)))
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(Num),
    Op(&'static str),
}

impl PartialEq for Num {
    fn eq(&self, other: &Self) -> bool {
        self.float() == other.float()
    }
}

fn tokenize(text: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == ' ' {
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let literal: String = chars[start..i].iter().collect();
            if literal.contains('.') {
                if literal.matches('.').count() > 1 || literal == "." {
                    return Err("invalid syntax".into());
                }
                out.push(Tok::Num(Num::Float(
                    literal.parse().map_err(|_| "invalid syntax".to_string())?,
                )));
            } else {
                if literal.len() > 1
                    && literal.starts_with('0')
                    && !literal.trim_start_matches('0').is_empty()
                {
                    return Err(
                        "leading zeros in decimal integer literals are not permitted".into(),
                    );
                }
                out.push(Tok::Num(match literal.parse::<i128>() {
                    Ok(i) => Num::Int(i),
                    Err(_) => {
                        Num::Float(literal.parse().map_err(|_| "invalid syntax".to_string())?)
                    }
                }));
            }
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let op = match two.as_str() {
                "**" => "**",
                "//" => "//",
                _ => match c {
                    '+' => "+",
                    '-' => "-",
                    '*' => "*",
                    '/' => "/",
                    '(' => "(",
                    ')' => ")",
                    _ => return Err("invalid syntax".into()),
                },
            };
            i += op.len();
            out.push(Tok::Op(op));
        }
    }
    Ok(out)
}

struct Calc {
    tokens: Vec<Tok>,
    at: usize,
}

impl Calc {
    fn peek_op(&self) -> Option<&'static str> {
        match self.tokens.get(self.at) {
            Some(Tok::Op(op)) => Some(op),
            _ => None,
        }
    }

    fn sum(&mut self) -> Result<Num, String> {
        let mut left = self.product()?;
        while let Some(op @ ("+" | "-")) = self.peek_op() {
            self.at += 1;
            let right = self.product()?;
            left = arith(op, left, right)?;
        }
        Ok(left)
    }

    fn product(&mut self) -> Result<Num, String> {
        let mut left = self.unary()?;
        while let Some(op @ ("*" | "/" | "//")) = self.peek_op() {
            self.at += 1;
            let right = self.unary()?;
            left = arith(op, left, right)?;
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Num, String> {
        match self.peek_op() {
            Some("-") => {
                self.at += 1;
                Ok(match self.unary()? {
                    Num::Int(i) => Num::Int(-i),
                    Num::Float(f) => Num::Float(-f),
                })
            }
            Some("+") => {
                self.at += 1;
                self.unary()
            }
            _ => self.power(),
        }
    }

    fn power(&mut self) -> Result<Num, String> {
        let base = self.atom()?;
        if self.peek_op() == Some("**") {
            self.at += 1;
            // `**` binds tighter than a unary minus on its left, looser on its right.
            let exponent = self.unary()?;
            return arith("**", base, exponent);
        }
        Ok(base)
    }

    fn atom(&mut self) -> Result<Num, String> {
        match self.tokens.get(self.at).cloned() {
            Some(Tok::Num(n)) => {
                self.at += 1;
                Ok(n)
            }
            Some(Tok::Op("(")) => {
                self.at += 1;
                let value = self.sum()?;
                if self.peek_op() != Some(")") {
                    return Err("invalid syntax".into());
                }
                self.at += 1;
                Ok(value)
            }
            _ => Err("invalid syntax".into()),
        }
    }
}

fn arith(op: &str, a: Num, b: Num) -> Result<Num, String> {
    let zero = || Err::<Num, String>("division by zero".into());
    Ok(match (op, a, b) {
        ("+", Num::Int(x), Num::Int(y)) => x
            .checked_add(y)
            .map_or(Num::Float(x as f64 + y as f64), Num::Int),
        ("-", Num::Int(x), Num::Int(y)) => x
            .checked_sub(y)
            .map_or(Num::Float(x as f64 - y as f64), Num::Int),
        ("*", Num::Int(x), Num::Int(y)) => x
            .checked_mul(y)
            .map_or(Num::Float(x as f64 * y as f64), Num::Int),
        ("//", Num::Int(_), Num::Int(0)) => return zero(),
        ("//", Num::Int(x), Num::Int(y)) => Num::Int(
            x.div_euclid(y)
                - if (x.rem_euclid(y) != 0) && y < 0 {
                    1
                } else {
                    0
                },
        ),
        ("**", Num::Int(x), Num::Int(y)) if y >= 0 => u32::try_from(y)
            .ok()
            .and_then(|e| x.checked_pow(e))
            .map_or(Num::Float((x as f64).powf(y as f64)), Num::Int),
        (op, a, b) => {
            let (x, y) = (a.float(), b.float());
            match op {
                "+" => Num::Float(x + y),
                "-" => Num::Float(x - y),
                "*" => Num::Float(x * y),
                "/" | "//" if y == 0.0 => return zero(),
                "/" => Num::Float(x / y),
                "//" => Num::Float((x / y).floor()),
                _ => {
                    if x == 0.0 && y < 0.0 {
                        return Err("0.0 cannot be raised to a negative power".into());
                    }
                    Num::Float(x.powf(y))
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_and_repr_follow_python() {
        // Values printed by Python 3: round(x, 2) and repr.
        for (x, rounded) in [
            (2.675, 2.67),
            (0.125, 0.12),
            (0.375, 0.38),
            (1.005, 1.0),
            (54.04 - 12.5, 41.54),
            (-0.001, -0.0),
        ] {
            assert_eq!(py_round2(x).to_bits(), f64::to_bits(rounded), "{x}");
        }
        for (x, repr) in [
            (54.04, "54.04"),
            (100.0, "100.0"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (-2.5, "-2.5"),
            (123456789012345.0, "123456789012345.0"),
        ] {
            assert_eq!(py_float_repr(x), repr);
        }
    }

    #[test]
    fn py_json_matches_python_dumps() {
        let value = json!({"b": [1.5, "é\"x"], "a": null, "c": true});
        assert_eq!(
            py_json(&value),
            r#"{"a": null, "b": [1.5, "\u00e9\"x"], "c": true}"#
        );
    }

    #[test]
    fn calculate_follows_python_arithmetic() {
        for (expression, answer) in [
            ("2 + 2", "4.0"),
            ("(54.04 - 12.5) * 2", "83.08"),
            ("10 / 4", "2.5"),
            ("7 // 2", "3.0"),
            ("-7 // 2", "-4.0"),
            ("2 ** 10", "1024.0"),
            ("-2 ** 2", "-4.0"),
            ("1 / 3", "0.33"),
        ] {
            assert_eq!(calculate(expression).as_deref(), Ok(answer), "{expression}");
        }
        assert_eq!(calculate("1 / 0"), Err("division by zero".to_string()));
        assert_eq!(
            calculate("2 + x"),
            Err("Invalid characters in expression".to_string())
        );
        assert!(calculate("(2 + 3").is_err());
        assert!(calculate("2 3").is_err());
    }
}
