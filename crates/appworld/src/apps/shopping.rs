//! The shopping app: orders and returns.

use serde_json::{Value, json};

use super::super::world::{Order, Return, World};
use super::{Args, Reply, Runtime, account, dollars, paginate};

/// Orders newest first (ties: higher id first).
pub fn order_listing(world: &World) -> Vec<(u32, &Order)> {
    let mut items: Vec<(u32, &Order)> = world
        .shopping
        .orders
        .iter()
        .map(|(id, o)| (*id, o))
        .collect();
    items.sort_by(|a, b| b.1.date.cmp(&a.1.date).then(b.0.cmp(&a.0)));
    items
}

/// Returns most recent first (ties: higher id first).
pub fn return_listing(world: &World) -> Vec<(u32, &Return)> {
    let mut items: Vec<(u32, &Return)> = world
        .shopping
        .returns
        .iter()
        .map(|(id, r)| (*id, r))
        .collect();
    items.sort_by(|a, b| b.1.returned_at.cmp(&a.1.returned_at).then(b.0.cmp(&a.0)));
    items
}

fn order_value(id: u32, o: &Order) -> Value {
    let total: i64 = o
        .items
        .iter()
        .map(|i| i.price_cents * i64::from(i.quantity))
        .sum();
    let items: Vec<Value> = o
        .items
        .iter()
        .map(|i| json!({"product_name": i.product_name, "quantity": i.quantity, "price": dollars(i.price_cents)}))
        .collect();
    json!({"order_id": id, "date": o.date, "total": dollars(total), "items": items})
}

pub(super) fn call(
    world: &mut World,
    rt: &mut Runtime,
    api: &str,
    args: &Args<'_>,
    paging: Option<(usize, usize)>,
    multi_page: &mut bool,
) -> Reply {
    if let Some(reply) = account::call(world, rt, "shopping", api, args) {
        return reply;
    }
    let (page, size) = paging.unwrap_or((1, super::DEFAULT_PAGE_SIZE));
    match api {
        "list_orders" => {
            let all: Vec<Value> = order_listing(world)
                .into_iter()
                .map(|(id, o)| order_value(id, o))
                .collect();
            let (items, multi) = paginate(&all, page, size);
            *multi_page = multi;
            Ok(json!({"page": page, "page_size": size, "orders": items}))
        }
        "show_order" => {
            let id = args.id("order_id");
            let o = id
                .and_then(|id| world.shopping.orders.get(&id))
                .ok_or_else(|| {
                    format!("No order with id {}.", args.int("order_id").unwrap_or(-1))
                })?;
            Ok(order_value(id.unwrap_or_default(), o))
        }
        "list_returns" => {
            let all: Vec<Value> = return_listing(world)
                .into_iter()
                .map(|(id, r)| {
                    json!({
                        "return_id": id,
                        "order_id": r.order_id,
                        "product_name": r.product_name,
                        "returned_at": r.returned_at,
                        "refund": dollars(r.refund_cents),
                    })
                })
                .collect();
            let (items, multi) = paginate(&all, page, size);
            *multi_page = multi;
            Ok(json!({"page": page, "page_size": size, "returns": items}))
        }
        _ => Err(format!("The app `shopping` has no API `{api}`.")),
    }
}
