//! Where API keys may come from and where they may go: the environment variables a run
//! configuration may name (only `*_API_KEY` ones, so a configuration cannot send `HOME` or a
//! cloud token as a Bearer key), endpoint URLs without credentials in them (a URL is logged
//! and saved in `run.json`), and plain `http://` only to the loopback host unless the
//! configuration allows it.
//!
//! The checks return what is wrong as text; [`crate::RunConfig`] names the file and field.

use std::net::{IpAddr, Ipv6Addr};

/// The suffix every key variable's name has.
pub const KEY_ENV_SUFFIX: &str = "_API_KEY";

/// Whether `name` may be read for an API key: an environment variable name (letters, digits,
/// `_`, not starting with a digit) ending in [`KEY_ENV_SUFFIX`] with something before it.
pub fn check_key_env(name: &str) -> Result<(), String> {
    let well_formed = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if well_formed && name.len() > KEY_ENV_SUFFIX.len() && name.ends_with(KEY_ENV_SUFFIX) {
        Ok(())
    } else {
        Err(format!(
            "expected the name of an environment variable ending in {KEY_ENV_SUFFIX} \
             (OPENAI_API_KEY, say), found `{name}`: only such variables are sent as API keys"
        ))
    }
}

/// The parts of an endpoint URL the checks look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http` or `https`, lower-cased.
    pub scheme: String,
    /// The host, without brackets or port, lower-cased.
    pub host: String,
}

impl Endpoint {
    /// Split `url`, refusing anything but an `http://` or `https://` URL without credentials.
    /// The message never repeats the URL, which may hold a password.
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err("expected an http:// or https:// URL".into());
        };
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(format!(
                "expected an http:// or https:// URL, found a {scheme}:// one"
            ));
        }
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return Err(format!(
                "the URL carries credentials (user:password@host); they would be logged and \
                 saved in run.json: give {scheme}://host... without them and put the key in \
                 the environment variable the configuration names"
            ));
        }
        let host = match authority.strip_prefix('[') {
            Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
            None => authority.split(':').next().unwrap_or_default(),
        };
        if host.is_empty() {
            return Err(format!("expected a host after {scheme}://"));
        }
        Ok(Endpoint {
            scheme,
            host: host.to_ascii_lowercase(),
        })
    }

    /// Whether the host is this machine: `localhost`, 127.0.0.0/8 or `::1`.
    pub fn is_loopback(&self) -> bool {
        if self.host == "localhost" {
            return true;
        }
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V4(ip)) => ip.is_loopback(),
            Ok(IpAddr::V6(ip)) => {
                ip == Ipv6Addr::LOCALHOST || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
            Err(_) => false,
        }
    }

    /// Whether an API key may be sent here: over https, or over plain http to the loopback
    /// host, or anywhere when `allow_insecure_http` says so.
    pub fn check_key_transport(&self, allow_insecure_http: bool) -> Result<(), String> {
        if self.scheme == "https" || self.is_loopback() || allow_insecure_http {
            return Ok(());
        }
        Err(format!(
            "an API key is set and would go unencrypted over plain http:// to `{}`; use \
             https://, a loopback host (localhost, 127.0.0.1, ::1), or allow plain http \
             explicitly (allow_insecure_http) if the network is trusted",
            self.host
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_variables_end_in_api_key() {
        for ok in ["OPENAI_API_KEY", "HARNESS_S_ENGINE_API_KEY", "my_API_KEY"] {
            check_key_env(ok).unwrap();
        }
        for bad in [
            "HOME",
            "AWS_SECRET_ACCESS_KEY",
            "_API_KEY",
            "",
            "1_API_KEY",
            "A-B_API_KEY",
        ] {
            let e = check_key_env(bad).unwrap_err();
            assert!(e.contains("_API_KEY"), "{bad}: {e}");
        }
    }

    #[test]
    fn urls_with_credentials_are_refused_without_repeating_them() {
        for url in [
            "https://user:hunter2@api.example.com/v1",
            "http://hunter2@127.0.0.1:8000/v1",
        ] {
            let e = Endpoint::parse(url).unwrap_err();
            assert!(e.contains("credentials") && !e.contains("hunter2"), "{e}");
        }
        // An `@` after the host is part of the path, not credentials.
        Endpoint::parse("https://api.example.com/v1/@me").unwrap();
        Endpoint::parse("ftp://example.com").unwrap_err();
        Endpoint::parse("example.com:8000").unwrap_err();
    }

    #[test]
    fn keys_go_over_plain_http_only_to_loopback_unless_allowed() {
        for url in [
            "http://localhost:8000/v1",
            "http://127.0.0.1:8000/v1",
            "http://127.8.9.10/v1",
            "http://[::1]:8000/v1",
            "HTTP://LOCALHOST/v1",
            "https://api.example.com/v1",
            "https://10.0.0.5:8443",
        ] {
            let endpoint = Endpoint::parse(url).unwrap();
            endpoint.check_key_transport(false).unwrap();
        }
        for url in [
            "http://api.example.com/v1",
            "http://10.0.0.5:8000",
            "http://[fe80::1]:8000",
            "http://localhost.example.com/v1",
            "http://0.0.0.0:8000",
        ] {
            let endpoint = Endpoint::parse(url).unwrap();
            let e = endpoint.check_key_transport(false).unwrap_err();
            assert!(e.contains("allow_insecure_http"), "{url}: {e}");
            endpoint.check_key_transport(true).unwrap();
        }
    }
}
