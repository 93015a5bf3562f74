//! The supervisor app: the user's profile and saved passwords.

use serde_json::json;

use super::super::world::World;
use super::{APPS, Args, Reply};

pub(super) fn call(world: &mut World, api: &str, args: &Args<'_>) -> Reply {
    match api {
        "show_profile" => {
            let p = world.user();
            Ok(
                json!({"first_name": p.first_name, "last_name": p.last_name, "email": p.email, "phone": p.phone}),
            )
        }
        "show_account_passwords" => {
            let passwords: Vec<_> = world
                .supervisor
                .passwords
                .iter()
                .map(|(app, password)| json!({"app": app, "password": password}))
                .collect();
            Ok(json!({"passwords": passwords}))
        }
        "update_account_password" => {
            let app = args.str("app").trim().to_lowercase();
            if !APPS.iter().any(|(name, _)| *name == app) || app == "supervisor" {
                return Err(format!(
                    "No app named `{}` has a saved password.",
                    super::truncate(&app, 40)
                ));
            }
            let password = args.str("password");
            if password.is_empty() {
                return Err("`password` must not be empty.".into());
            }
            world
                .supervisor
                .passwords
                .insert(app.clone(), password.to_string());
            Ok(json!({"message": format!("Saved the password for {app}.")}))
        }
        _ => Err(format!("The app `supervisor` has no API `{api}`.")),
    }
}
