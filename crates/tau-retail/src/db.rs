//! The retail database in memory: products with their variant items, users with their
//! payment methods, and orders, as `db.json` holds them.
//!
//! Field names and shapes follow the benchmark's data model, so a database written back out
//! ([`RetailDb::to_value`]) has the shape the benchmark's own dump has: every optional order
//! field (`cancel_reason`, `exchange_*`, `return_*`) is present, `null` until a tool sets it.
//! Maps are kept sorted by key. The benchmark iterates its maps in file order where a lookup
//! returns the first match (user by email, user by name and zip, item by id); the shipped
//! database has no duplicate emails, name-and-zip pairs or item ids, so the order never
//! changes an answer there.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// One variant of a product: an item that can be ordered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// The item id (ten digits).
    pub item_id: String,
    /// Option name to value (`color`, `size`, ...).
    pub options: BTreeMap<String, String>,
    /// Whether it is in stock.
    pub available: bool,
    /// Its price.
    pub price: f64,
}

/// A product type with its variants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Product {
    /// The product's name (`T-Shirt`).
    pub name: String,
    /// The product id (ten digits, distinct from item ids).
    pub product_id: String,
    /// Variants by item id.
    pub variants: BTreeMap<String, Variant>,
}

/// A user's name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserName {
    /// First name.
    pub first_name: String,
    /// Last name.
    pub last_name: String,
}

/// A postal address (a user's default one or an order's shipping address).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Address {
    /// First line.
    pub address1: String,
    /// Second line (may be empty).
    pub address2: String,
    /// City.
    pub city: String,
    /// Country.
    pub country: String,
    /// State.
    pub state: String,
    /// Zip code.
    pub zip: String,
}

/// A payment method, tagged by its `source`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case", deny_unknown_fields)]
pub enum PaymentMethod {
    /// A credit card.
    CreditCard {
        /// The method id (`credit_card_...`).
        id: String,
        /// The card's brand.
        brand: String,
        /// The last four digits.
        last_four: String,
    },
    /// A PayPal account.
    Paypal {
        /// The method id (`paypal_...`).
        id: String,
    },
    /// A gift card with a balance.
    GiftCard {
        /// The method id (`gift_card_...`).
        id: String,
        /// The balance.
        balance: f64,
    },
}

impl PaymentMethod {
    /// The method id.
    pub fn id(&self) -> &str {
        match self {
            PaymentMethod::CreditCard { id, .. }
            | PaymentMethod::Paypal { id }
            | PaymentMethod::GiftCard { id, .. } => id,
        }
    }

    /// The `source` tag (`credit_card`, `paypal`, `gift_card`).
    pub fn source(&self) -> &'static str {
        match self {
            PaymentMethod::CreditCard { .. } => "credit_card",
            PaymentMethod::Paypal { .. } => "paypal",
            PaymentMethod::GiftCard { .. } => "gift_card",
        }
    }
}

/// A user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    /// The user id (`sara_doe_496`).
    pub user_id: String,
    /// The name.
    pub name: UserName,
    /// The default address.
    pub address: Address,
    /// The email address.
    pub email: String,
    /// Payment methods by id.
    pub payment_methods: BTreeMap<String, PaymentMethod>,
    /// The user's order ids.
    pub orders: Vec<String>,
}

/// One item of an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderItem {
    /// The product's name.
    pub name: String,
    /// The product id.
    pub product_id: String,
    /// The item (variant) id.
    pub item_id: String,
    /// The price paid.
    pub price: f64,
    /// The variant's options.
    pub options: BTreeMap<String, String>,
}

/// A shipment of some of an order's items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fulfillment {
    /// Tracking ids.
    pub tracking_id: Vec<String>,
    /// The items shipped.
    pub item_ids: Vec<String>,
}

/// A payment or refund of an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Payment {
    /// `payment` or `refund`.
    pub transaction_type: String,
    /// The amount.
    pub amount: f64,
    /// The payment method used.
    pub payment_method_id: String,
}

/// An order. The optional fields are written by the write tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Order {
    /// The order id (`#W0000000`).
    pub order_id: String,
    /// The user who placed it.
    pub user_id: String,
    /// The shipping address.
    pub address: Address,
    /// The items.
    pub items: Vec<OrderItem>,
    /// `pending`, `pending (item modified)`, `processed`, `delivered`, `cancelled`,
    /// `exchange requested` or `return requested`.
    pub status: String,
    /// Shipments.
    pub fulfillments: Vec<Fulfillment>,
    /// Payments and refunds in order.
    pub payment_history: Vec<Payment>,
    /// Why it was cancelled.
    #[serde(default)]
    pub cancel_reason: Option<String>,
    /// Items to be exchanged (sorted).
    #[serde(default)]
    pub exchange_items: Option<Vec<String>>,
    /// Items they are exchanged for (sorted).
    #[serde(default)]
    pub exchange_new_items: Option<Vec<String>>,
    /// The method that pays or receives the exchange's price difference.
    #[serde(default)]
    pub exchange_payment_method_id: Option<String>,
    /// The exchange's price difference.
    #[serde(default)]
    pub exchange_price_difference: Option<f64>,
    /// Items to be returned (sorted).
    #[serde(default)]
    pub return_items: Option<Vec<String>>,
    /// The method that receives the refund of a return.
    #[serde(default)]
    pub return_payment_method_id: Option<String>,
}

/// The whole database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetailDb {
    /// Products by product id.
    pub products: BTreeMap<String, Product>,
    /// Users by user id.
    pub users: BTreeMap<String, User>,
    /// Orders by order id.
    pub orders: BTreeMap<String, Order>,
}

/// Where two databases first differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DbDifference {
    /// The first differing field, e.g. `orders["#W2378156"].status`.
    pub path: String,
    /// Its value in the expected database (`null` when absent there).
    pub expected: Value,
    /// Its value in the database found (`null` when absent there).
    pub found: Value,
    /// How many records (products, users, orders) differ in all.
    pub differing_records: usize,
}

impl RetailDb {
    /// Read `db.json`.
    pub fn load(path: &Path) -> Result<RetailDb> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parse the text of `db.json` (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<RetailDb> {
        let db: RetailDb = serde_json::from_str(text).map_err(|e| Error::Format {
            path: path.to_path_buf(),
            field: String::new(),
            message: format!(
                "expected the retail database ({{\"products\", \"users\", \"orders\"}}): {e}"
            ),
        })?;
        db.check_keys(path)?;
        Ok(db)
    }

    /// Every map key must equal the id inside its record: the tools look records up by key.
    fn check_keys(&self, path: &Path) -> Result<()> {
        let bad = |field: String, inner: &str| Error::Format {
            path: path.to_path_buf(),
            field,
            message: format!("the key differs from the record's `{inner}`; expected them equal"),
        };
        for (key, product) in &self.products {
            if *key != product.product_id {
                return Err(bad(format!("products.{key}"), "product_id"));
            }
            for (item, variant) in &product.variants {
                if *item != variant.item_id {
                    return Err(bad(format!("products.{key}.variants.{item}"), "item_id"));
                }
            }
        }
        for (key, user) in &self.users {
            if *key != user.user_id {
                return Err(bad(format!("users.{key}"), "user_id"));
            }
            for (id, method) in &user.payment_methods {
                if id != method.id() {
                    return Err(bad(format!("users.{key}.payment_methods.{id}"), "id"));
                }
            }
        }
        for (key, order) in &self.orders {
            if *key != order.order_id {
                return Err(bad(format!("orders.{key}"), "order_id"));
            }
        }
        Ok(())
    }

    /// The database as JSON, in the shape of the benchmark's dump.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Where `self` (the database found) first differs from `expected`, or `None` when they
    /// are equal. Records are compared in the order products, users, orders, each by key.
    pub fn first_difference(&self, expected: &RetailDb) -> Option<DbDifference> {
        let mut first: Option<(String, Value, Value)> = None;
        let mut count = 0;
        compare_maps(
            "products",
            &expected.products,
            &self.products,
            &mut first,
            &mut count,
        );
        compare_maps(
            "users",
            &expected.users,
            &self.users,
            &mut first,
            &mut count,
        );
        compare_maps(
            "orders",
            &expected.orders,
            &self.orders,
            &mut first,
            &mut count,
        );
        first.map(|(path, expected, found)| DbDifference {
            path,
            expected,
            found,
            differing_records: count,
        })
    }
}

fn compare_maps<T: PartialEq + Serialize>(
    table: &str,
    expected: &BTreeMap<String, T>,
    found: &BTreeMap<String, T>,
    first: &mut Option<(String, Value, Value)>,
    count: &mut usize,
) {
    let keys: std::collections::BTreeSet<&String> = expected.keys().chain(found.keys()).collect();
    for key in keys {
        let (a, b) = (expected.get(key), found.get(key));
        if a == b {
            continue;
        }
        *count += 1;
        if first.is_none() {
            let to_value = |r: Option<&T>| {
                r.map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
                    .unwrap_or(Value::Null)
            };
            let path = format!("{table}[{}]", serde_json::json!(key));
            *first = Some(first_value_difference(path, &to_value(a), &to_value(b)));
        }
    }
}

/// The path and values of the first difference between two JSON values, depth first.
fn first_value_difference(path: String, a: &Value, b: &Value) -> (String, Value, Value) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let (u, v) = (
                    x.get(key).unwrap_or(&Value::Null),
                    y.get(key).unwrap_or(&Value::Null),
                );
                if u != v {
                    return first_value_difference(format!("{path}.{key}"), u, v);
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                if u != v {
                    return first_value_difference(format!("{path}[{i}]"), u, v);
                }
            }
        }
        _ => {}
    }
    (path, a.clone(), b.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> RetailDb {
        let text = r##"{
          "products": {"1": {"name": "Lamp", "product_id": "1", "variants": {
              "11": {"item_id": "11", "options": {"color": "red"}, "available": true, "price": 10.5}}}},
          "users": {"ann_lee_1": {"user_id": "ann_lee_1", "name": {"first_name": "Ann", "last_name": "Lee"},
              "address": {"address1": "1 Main St", "address2": "", "city": "Austin", "country": "USA", "state": "TX", "zip": "78701"},
              "email": "ann@example.com",
              "payment_methods": {"gift_card_1": {"source": "gift_card", "id": "gift_card_1", "balance": 20.0}},
              "orders": ["#W1"]}},
          "orders": {"#W1": {"order_id": "#W1", "user_id": "ann_lee_1",
              "address": {"address1": "1 Main St", "address2": "", "city": "Austin", "country": "USA", "state": "TX", "zip": "78701"},
              "items": [{"name": "Lamp", "product_id": "1", "item_id": "11", "price": 10.5, "options": {"color": "red"}}],
              "status": "pending", "fulfillments": [],
              "payment_history": [{"transaction_type": "payment", "amount": 10.5, "payment_method_id": "gift_card_1"}]}}
        }"##;
        RetailDb::parse(text, Path::new("db.json")).unwrap()
    }

    #[test]
    fn optional_order_fields_are_written_as_null() {
        let value = tiny().to_value();
        let order = &value["orders"]["#W1"];
        assert_eq!(order["cancel_reason"], Value::Null);
        assert!(order.as_object().unwrap().contains_key("return_items"));
        assert_eq!(
            value["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["source"],
            "gift_card"
        );
    }

    #[test]
    fn the_first_difference_names_the_record_and_field() {
        let expected = tiny();
        assert_eq!(expected.first_difference(&expected), None);
        let mut found = expected.clone();
        found.orders.get_mut("#W1").unwrap().status = "cancelled".into();
        let diff = found.first_difference(&expected).unwrap();
        assert_eq!(diff.path, "orders[\"#W1\"].status");
        assert_eq!(diff.expected, "pending");
        assert_eq!(diff.found, "cancelled");
        assert_eq!(diff.differing_records, 1);
    }

    #[test]
    fn a_mismatched_key_or_an_unknown_field_names_the_field() {
        let text = r#"{"products": {"2": {"name": "x", "product_id": "3", "variants": {}}}, "users": {}, "orders": {}}"#;
        let err = RetailDb::parse(text, Path::new("db.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("db.json") && err.contains("products.2"),
            "{err}"
        );
        let text = r#"{"products": {}, "users": {}, "orders": {}, "extra": 1}"#;
        let err = RetailDb::parse(text, Path::new("db.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("extra"), "{err}");
    }
}
