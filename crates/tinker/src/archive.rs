//! The archive of a sampler checkpoint: where the server serves it (from the `tinker://` path)
//! and how its adapter is unpacked, strictly.
//!
//! The archive is a tar, possibly gzipped, holding `adapter_model.safetensors` and
//! `adapter_config.json` (PEFT's layout), at its root, under `./` or under one top folder.
//! Anything else is refused with an [`Error::Protocol`] naming the entry: a link or device
//! (it could point outside the destination), a path with `..` or an absolute one, another
//! file, a file twice, or a missing adapter file. The files land in a fresh folder beside the
//! destination that is renamed over it only once both are written, so a reader never sees a
//! half-unpacked adapter.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// The adapter's weights in an archive.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// The adapter's PEFT configuration in an archive.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";

/// `tinker://<model_id>/<checkpoint id>` split into the model id and the checkpoint id (the
/// rest: `<name>` on SkyRL's server, `sampler_weights/<name>` on hosted Tinker).
pub fn split_tinker_path(path: &str) -> Result<(String, String)> {
    let bad = |why: &str| {
        Error::config(
            "sampler weights path",
            format!("expected `tinker://<model_id>/<checkpoint>`, got `{path}`: {why}"),
        )
    };
    let rest = path
        .strip_prefix("tinker://")
        .ok_or_else(|| bad("no `tinker://` scheme"))?;
    let (model, id) = rest
        .split_once('/')
        .ok_or_else(|| bad("no checkpoint after the model id"))?;
    let id = id.trim_end_matches('/');
    if model.is_empty() || id.is_empty() {
        return Err(bad("empty model id or checkpoint"));
    }
    if id.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return Err(bad("an empty, `.` or `..` segment"));
    }
    Ok((model.to_string(), id.to_string()))
}

/// `text` percent-encoded for one URL path segment (everything but RFC 3986's unreserved
/// characters).
pub(crate) fn encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The archive endpoint's path below `/api/v1/` for a checkpoint: each segment encoded.
pub(crate) fn archive_endpoint(model: &str, id: &str) -> String {
    let id: Vec<String> = id.split('/').map(encode_segment).collect();
    format!(
        "training_runs/{}/checkpoints/{}/archive",
        encode_segment(model),
        id.join("/")
    )
}

/// Unpack the adapter in `archive` (tar or tar.gz bytes of the checkpoint `what`) into `dest`,
/// which is replaced whole. The files written may total at most `max_unpacked` bytes.
pub fn unpack_adapter(archive: &[u8], dest: &Path, what: &str, max_unpacked: u64) -> Result<()> {
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = dest.file_name().ok_or_else(|| {
        Error::config(
            "download destination",
            format!("`{}` names no folder", dest.display()),
        )
    })?;
    std::fs::create_dir_all(&parent).map_err(|e| Error::Io {
        path: parent.clone(),
        source: e,
    })?;
    let mut tmp_name = file_name.to_os_string();
    tmp_name.push(format!(".tmp-{}", crate::client::nonce()));
    let tmp = parent.join(tmp_name);
    std::fs::create_dir(&tmp).map_err(|e| Error::Io {
        path: tmp.clone(),
        source: e,
    })?;
    let unpacked = unpack_into(archive, &tmp, what, max_unpacked).and_then(|()| {
        replace_dir(&tmp, dest).map_err(|(path, source)| Error::Io { path, source })
    });
    if unpacked.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    unpacked
}

/// Remove `dest` (a folder or a file) if there is one, then rename `tmp` to it.
fn replace_dir(tmp: &Path, dest: &Path) -> std::result::Result<(), (PathBuf, std::io::Error)> {
    match std::fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => {
            std::fs::remove_dir_all(dest).map_err(|e| (dest.to_path_buf(), e))?;
        }
        Ok(_) => std::fs::remove_file(dest).map_err(|e| (dest.to_path_buf(), e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err((dest.to_path_buf(), e)),
    }
    std::fs::rename(tmp, dest).map_err(|e| (dest.to_path_buf(), e))
}

fn unpack_into(archive: &[u8], dir: &Path, what: &str, max_unpacked: u64) -> Result<()> {
    let refuse = |msg: String| Error::Protocol(format!("archive of {what}: {msg}"));
    let reader: Box<dyn Read + '_> = if archive.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(archive))
    } else {
        Box::new(archive)
    };
    let mut tar = tar::Archive::new(reader);
    let entries = tar
        .entries()
        .map_err(|e| refuse(format!("not a tar archive: {e}")))?;
    let mut top: Option<String> = None;
    let mut found = [false, false];
    let mut budget = max_unpacked;
    let mut any = false;
    for entry in entries {
        let mut entry = entry.map_err(|e| refuse(format!("not a readable tar archive: {e}")))?;
        any = true;
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            // pax metadata for the whole archive (e.g. `git archive`'s commit id).
            continue;
        }
        let root_only = Path::new(&raw)
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::CurDir));
        if kind.is_dir() && root_only {
            // The archive's own root: SkyRL's server (Python's tarfile with `arcname=""`)
            // writes it as `/`. Nothing is created from folder entries.
            continue;
        }
        let mut parts = Vec::new();
        for c in Path::new(&raw).components() {
            match c {
                Component::CurDir => {}
                Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
                Component::ParentDir => {
                    return Err(refuse(format!("entry `{raw}` has a `..` in its path")));
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(refuse(format!("entry `{raw}` has an absolute path")));
                }
            }
        }
        if kind.is_dir() {
            if parts.len() > 1 {
                return Err(refuse(format!(
                    "entry `{raw}`: a nested folder; expected the adapter files at the root or in one top folder"
                )));
            }
            continue;
        }
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            return Err(refuse(format!(
                "entry `{raw}` is a {kind:?}, not a regular file; links and devices are refused"
            )));
        }
        let (name, folder) = match parts.as_slice() {
            [name] => (name.clone(), String::new()),
            [folder, name] => (name.clone(), folder.clone()),
            _ => {
                return Err(refuse(format!(
                    "entry `{raw}` is nested too deep; expected `{ADAPTER_WEIGHTS}` and `{ADAPTER_CONFIG}` at the root or in one top folder"
                )));
            }
        };
        let slot = match name.as_str() {
            ADAPTER_WEIGHTS => 0,
            ADAPTER_CONFIG => 1,
            _ => {
                return Err(refuse(format!(
                    "unexpected file `{raw}`; expected only `{ADAPTER_WEIGHTS}` and `{ADAPTER_CONFIG}`"
                )));
            }
        };
        match &top {
            Some(t) if *t != folder => {
                return Err(refuse(format!(
                    "entry `{raw}` is in another folder than the first adapter file (`{t}`)"
                )));
            }
            _ => top = Some(folder),
        }
        if found[slot] {
            return Err(refuse(format!("entry `{raw}`: `{name}` appears twice")));
        }
        found[slot] = true;
        let path = dir.join(&name);
        let mut file = std::fs::File::create(&path).map_err(|e| Error::Io {
            path: path.clone(),
            source: e,
        })?;
        let copied = std::io::copy(&mut (&mut entry).take(budget + 1), &mut file)
            .map_err(|e| refuse(format!("entry `{raw}` cannot be read: {e}")))?;
        if copied > budget {
            return Err(refuse(format!(
                "the unpacked files exceed {max_unpacked} bytes"
            )));
        }
        budget -= copied;
    }
    if !any {
        return Err(refuse("the archive is empty".into()));
    }
    for (slot, name) in [ADAPTER_WEIGHTS, ADAPTER_CONFIG].iter().enumerate() {
        if !found[slot] {
            return Err(refuse(format!("no `{name}` in the archive")));
        }
    }
    let config = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read(&config).map_err(|e| Error::Io {
        path: config.clone(),
        source: e,
    })?;
    if !matches!(
        serde_json::from_slice::<serde_json::Value>(&text),
        Ok(serde_json::Value::Object(_))
    ) {
        return Err(refuse(format!("`{ADAPTER_CONFIG}` is not a JSON object")));
    }
    check_safetensors(&dir.join(ADAPTER_WEIGHTS)).map_err(refuse)
}

/// The file's header is a JSON object that fits in the file, and every tensor's data range
/// lies within it.
fn check_safetensors(path: &Path) -> std::result::Result<(), String> {
    let bad = |why: String| format!("`{ADAPTER_WEIGHTS}` is not a safetensors file: {why}");
    let mut f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let size = f.metadata().map_err(|e| bad(e.to_string()))?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| bad("shorter than 8 bytes".into()))?;
    let n = u64::from_le_bytes(len);
    if n > size - 8 {
        return Err(bad(format!(
            "a header of {n} bytes in a file of {size} bytes"
        )));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("the header is not a JSON object".into()))?;
    let data = size - 8 - n;
    for (name, t) in obj.iter().filter(|(k, _)| *k != "__metadata__") {
        let end = t["data_offsets"][1].as_u64();
        if end.is_none_or(|e| e > data) {
            return Err(bad(format!(
                "tensor `{name}` ends past the data ({data} bytes)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_model_and_checkpoint() {
        assert_eq!(
            split_tinker_path("tinker://m1/v3").unwrap(),
            ("m1".into(), "v3".into())
        );
        assert_eq!(
            split_tinker_path("tinker://m1/sampler_weights/v3").unwrap(),
            ("m1".into(), "sampler_weights/v3".into())
        );
        for bad in ["m1/v3", "tinker://m1", "tinker:///v3", "tinker://m/../x"] {
            assert!(split_tinker_path(bad).is_err(), "{bad}");
        }
        assert_eq!(
            archive_endpoint("m 1", "sampler_weights/a b"),
            "training_runs/m%201/checkpoints/sampler_weights/a%20b/archive"
        );
    }

    fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if name.ends_with('/') {
                h.set_entry_type(tar::EntryType::Directory);
            }
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    const WEIGHTS: &[u8] = b"\x02\x00\x00\x00\x00\x00\x00\x00{}";

    #[test]
    fn a_root_folder_entry_as_skyrl_writes_it_is_skipped_and_a_root_file_is_not() {
        let root = std::env::temp_dir().join(format!("tinker-archive-{}", crate::client::nonce()));
        let with_root = |kind: tar::EntryType| {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_gnu();
            h.as_old_mut().name[0] = b'/';
            h.set_entry_type(kind);
            h.set_size(0);
            h.set_mode(0o755);
            h.set_cksum();
            b.append(&h, &[][..]).unwrap();
            for (name, data) in [
                (ADAPTER_WEIGHTS, WEIGHTS),
                (ADAPTER_CONFIG, b"{\"r\": 4}".as_slice()),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                b.append_data(&mut h, name, data).unwrap();
            }
            b.into_inner().unwrap()
        };
        let dest = root.join("ok");
        unpack_adapter(
            &with_root(tar::EntryType::Directory),
            &dest,
            "skyrl",
            1 << 20,
        )
        .unwrap();
        assert!(dest.join(ADAPTER_WEIGHTS).is_file() && dest.join(ADAPTER_CONFIG).is_file());
        let err = unpack_adapter(
            &with_root(tar::EntryType::Regular),
            &root.join("bad"),
            "x",
            1 << 20,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("absolute path"), "{err}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn plain_tars_under_dot_or_one_folder_unpack() {
        let root = std::env::temp_dir().join(format!("tinker-archive-{}", crate::client::nonce()));
        for (k, layout) in ["", "./", "run-7/"].iter().enumerate() {
            let w = format!("{layout}{ADAPTER_WEIGHTS}");
            let c = format!("{layout}{ADAPTER_CONFIG}");
            let mut entries: Vec<(&str, &[u8])> = vec![(&w, WEIGHTS), (&c, b"{\"r\": 2}")];
            if layout.len() > 2 {
                entries.insert(0, (layout, b""));
            }
            let dest = root.join(format!("d{k}"));
            unpack_adapter(&tar_of(&entries), &dest, "t", 1 << 20).unwrap();
            assert!(dest.join(ADAPTER_WEIGHTS).is_file() && dest.join(ADAPTER_CONFIG).is_file());
        }
        let split = tar_of(&[
            (&format!("a/{ADAPTER_WEIGHTS}"), WEIGHTS),
            (&format!("b/{ADAPTER_CONFIG}"), b"{}"),
        ]);
        let e = unpack_adapter(&split, &root.join("x"), "t", 1 << 20).unwrap_err();
        assert!(e.to_string().contains("another folder"), "{e}");
        let twice = tar_of(&[(ADAPTER_CONFIG, b"{}"), (ADAPTER_CONFIG, b"{}")]);
        let e = unpack_adapter(&twice, &root.join("x"), "t", 1 << 20).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        let big = tar_of(&[(ADAPTER_CONFIG, &[b' '; 64]), (ADAPTER_WEIGHTS, WEIGHTS)]);
        let e = unpack_adapter(&big, &root.join("x"), "t", 32).unwrap_err();
        assert!(e.to_string().contains("exceed 32 bytes"), "{e}");
        let bad = tar_of(&[
            (ADAPTER_CONFIG, b"{}"),
            (ADAPTER_WEIGHTS, b"\xff\xff\xff\xff\x00\x00\x00\x00"),
        ]);
        let e = unpack_adapter(&bad, &root.join("x"), "t", 1 << 20).unwrap_err();
        assert!(e.to_string().contains("not a safetensors file"), "{e}");
        assert!(!root.join("x").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
