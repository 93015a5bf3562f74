//! The sandbox every command of the repository-repair world runs in: Linux namespaces through
//! bubblewrap (`bwrap`), resource limits through `prlimit`, and (when the trainer runs as root)
//! an unprivileged user through `setpriv`.
//!
//! A sandboxed command sees:
//! - no network (its own network namespace holds only a loopback device), unless
//!   [`SandboxConfig::share_network`] gives it the host's;
//! - its own pid namespace with a fresh `/proc`: the trainer and other episodes are not there,
//!   and when the sandbox's first process ends, the kernel kills everything left inside (a
//!   `setsid` child included); bwrap also dies with the trainer's thread that started it;
//! - the system read-only (`/usr`, `/bin`, `/lib*`, a few files of `/etc`, the Python
//!   installation), a private `/tmp` (a size-capped tmpfs), `/dev` with only the basic devices;
//! - one directory of the host, the episode's repository copy (writable for the policy's
//!   commands, read-only for verification), and the further paths a caller binds read-only
//!   ([`Sandbox::command_with`]: an agent program's script file and its relay's sockets);
//! - an environment with only `PATH`, `HOME=/tmp`, `TMPDIR`, `LANG`, `USER` and the `PYTHON*`
//!   flags the runners need;
//! - limits on CPU seconds, address space, processes and file size ([`SandboxConfig`]), set by
//!   `prlimit` inside the namespaces, right before the command starts.
//!
//! # Users and the process limit
//! `RLIMIT_NPROC` counts the processes of a user, and the kernel does not enforce it for root.
//! So when the trainer runs as root, bwrap keeps only the capabilities needed to change user,
//! and `setpriv` switches the command to a user of its own, leased from
//! [`SandboxConfig::first_uid`].. for the command's lifetime: no two running sandboxes share
//! one, so each has its own process count. The directory the command may use is handed to that
//! user (`chown`). Otherwise bwrap runs unprivileged in a new user namespace, where the limit
//! counts the processes of that namespace.
//!
//! # Probe
//! [`Sandbox::new`] resolves the Python interpreter, then runs a probe inside a sandbox built
//! exactly like the real ones and checks from inside that the user is unprivileged, the system
//! is read-only, the directory is writable and, unless it is shared, there is no network. When
//! bwrap is missing or the probe fails, it returns an error that says how to install
//! bubblewrap.
//!
//! The trainer's own environment (API keys) is kept out of the sandbox by the empty environment
//! and the pid namespace; [`set_non_dumpable`] also keeps it from processes of the same user
//! outside any sandbox. Binaries call it at start-up; it is a process-wide decision.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Settings of the sandbox (`SweConfig::sandbox`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// The bubblewrap program: `bwrap` is looked up in `/usr/local/bin`, `/usr/bin` and
    /// `/bin`; give a path for one elsewhere.
    pub bwrap: String,
    /// Run commands without a sandbox when none can be made, instead of refusing to start.
    /// **Unsafe**: the policy's code then runs with the trainer's user, files, network and
    /// environment. Only for trusted policies on a machine without bubblewrap.
    pub allow_unsandboxed: bool,
    /// CPU seconds per process (`RLIMIT_CPU`).
    pub cpu_seconds: u64,
    /// Address space per process in bytes (`RLIMIT_AS`).
    pub address_space_bytes: u64,
    /// Processes (and threads) per sandbox (`RLIMIT_NPROC`).
    pub max_processes: u64,
    /// The largest file a command may write, in bytes (`RLIMIT_FSIZE`).
    pub file_size_bytes: u64,
    /// Size of the private `/tmp`, in bytes (and, apart, of the private `/dev/shm`).
    pub tmp_bytes: u64,
    /// When the trainer runs as root: the first of the user ids the sandboxes run as.
    pub first_uid: u32,
    /// When the trainer runs as root: how many user ids from `first_uid` on may be leased.
    pub uid_count: u32,
    /// Give commands the host's network namespace instead of an empty one of their own. This
    /// gives up the network isolation: a command can reach every service listening on the
    /// host's loopback and, through the host, the network. Nothing needs it: agent programs
    /// keep a network of their own and reach harness-external's two servers through Unix
    /// sockets bound into the sandbox (its `relay`); tests set it as the control.
    pub share_network: bool,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            bwrap: "bwrap".to_string(),
            allow_unsandboxed: false,
            cpu_seconds: 60,
            address_space_bytes: 4 << 30,
            max_processes: 128,
            file_size_bytes: 64 << 20,
            tmp_bytes: 256 << 20,
            first_uid: 60_000,
            uid_count: 1_000,
            share_network: false,
        }
    }
}

impl SandboxConfig {
    /// Check every setting; the error names the field (under `prefix`) and what was expected.
    pub fn check(&self, prefix: &str) -> std::result::Result<(), (String, String)> {
        let field = |name: &str| format!("{prefix}.{name}");
        let at_least = |name: &str, value: u64, min: u64, unit: &str| {
            if value < min {
                Err((
                    field(name),
                    format!("must be at least {min} {unit}, got {value}"),
                ))
            } else {
                Ok(())
            }
        };
        if self.bwrap.trim().is_empty() {
            return Err((
                field("bwrap"),
                "must name the bubblewrap program (`bwrap`)".into(),
            ));
        }
        at_least("cpu_seconds", self.cpu_seconds, 1, "second")?;
        at_least(
            "address_space_bytes",
            self.address_space_bytes,
            64 << 20,
            "bytes",
        )?;
        // The verifier's runner needs three processes per test id (runner, test, reporter).
        at_least("max_processes", self.max_processes, 4, "processes")?;
        at_least("file_size_bytes", self.file_size_bytes, 1 << 20, "bytes")?;
        at_least("tmp_bytes", self.tmp_bytes, 1 << 20, "bytes")?;
        if self.first_uid == 0 {
            return Err((
                field("first_uid"),
                "must not be 0 (root); expected an unused user id such as 60000".into(),
            ));
        }
        if self.uid_count == 0 || self.first_uid.checked_add(self.uid_count).is_none() {
            return Err((
                field("uid_count"),
                format!(
                    "must be at least 1 and keep first_uid + uid_count within 32 bits, got {}",
                    self.uid_count
                ),
            ));
        }
        Ok(())
    }
}

/// A sandbox that passed its probe: what every confined command is built from.
#[derive(Debug, Clone)]
pub struct Sandbox {
    config: SandboxConfig,
    /// The Python interpreter (`sys.executable`), the same path inside and outside.
    python: PathBuf,
    /// Folders of the Python installation outside the system folders, bound read-only.
    python_dirs: Vec<PathBuf>,
    /// The trainer runs as root: drop to a leased user inside.
    privileged: bool,
    /// bwrap's version: `--size` needs 0.7, `--disable-userns` 0.8.
    version: (u32, u32, u32),
    /// util-linux's `setpriv` and `prlimit`, by their paths in the system folders (the same
    /// inside, where they run).
    setpriv: PathBuf,
    prlimit: PathBuf,
}

/// Where programs are looked up, inside and for bwrap itself (after the interpreter's folder).
const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// System folders bound read-only (or recreated as the same links).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// Entries of `/etc` the interpreter, the dynamic loader and common tools read.
const ETC_ENTRIES: &[&str] = &[
    "alternatives",
    "group",
    "host.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "passwd",
];

/// How to get a sandbox, for every error that says there is none.
const HOW: &str = "install bubblewrap (`apt-get install bubblewrap`; it needs user namespaces \
    unless the trainer runs as root) or, only for trusted policies, set `allow_unsandboxed` in \
    the sandbox settings (unsafe: the policy's code then runs with the trainer's user, files, \
    network and environment)";

/// What the probe prints when every check inside held.
const PROBE_OK: &str = "harness-sandbox-ok";

/// The probe: checks from inside what the sandbox promises. Its argument is `isolated` when
/// the sandbox has no network of its own to check.
const PROBE: &str = r#"
import os, socket, sys
problems = []
if os.getuid() == 0 or os.geteuid() == 0:
    problems.append("the command runs as root")
with open("/proc/self/status") as handle:
    for line in handle:
        if line.startswith("CapEff:") and int(line.split()[1], 16) != 0:
            problems.append("the command has capabilities: " + line.strip())
try:
    open(os.path.join(sys.prefix, ".harness-probe"), "w")
    problems.append("the Python installation is writable")
except OSError:
    pass
try:
    with open(".harness-probe", "w") as handle:
        handle.write("x")
    os.remove(".harness-probe")
except OSError as exc:
    problems.append("the working directory is not writable: %s" % exc)
if sys.argv[1:] == ["isolated"]:
    try:
        socket.create_connection(("192.0.2.1", 9), timeout=0.2).close()
        problems.append("the network is reachable")
    except OSError:
        pass
print("; ".join(problems) if problems else "harness-sandbox-ok")
"#;

impl Sandbox {
    /// Check `config`, resolve `python` (run outside any sandbox: it is the operator's
    /// interpreter, and no repository code runs) and probe a sandbox built from them. The error
    /// says what failed and how to get a sandbox.
    pub fn new(config: &SandboxConfig, python: &str) -> std::result::Result<Sandbox, String> {
        config
            .check("sandbox")
            .map_err(|(field, message)| format!("`{field}` {message}"))?;
        let version = bwrap_version(&config.bwrap)?;
        let (python, python_dirs) = resolve_python(python)?;
        let sandbox = Sandbox {
            config: config.clone(),
            python,
            python_dirs,
            privileged: is_root(),
            version,
            setpriv: system_program("setpriv")?,
            prlimit: system_program("prlimit")?,
        };
        sandbox.probe()?;
        Ok(sandbox)
    }

    /// The settings.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// The Python interpreter commands run (`sys.executable` of the configured one).
    pub fn python(&self) -> &Path {
        &self.python
    }

    /// A command running `program args` in `dir` inside a sandbox, with stdin, stdout and
    /// stderr left for the caller to set. `dir` is the only folder of the host the command
    /// sees, writable when `writable` (otherwise read-only). Keep the returned lease until the
    /// command has ended.
    pub fn command(
        &self,
        dir: &Path,
        writable: bool,
        program: &str,
        args: &[&str],
    ) -> std::io::Result<(Command, Option<UidLease>)> {
        self.command_with(dir, writable, &[], program, args)
    }

    /// [`Sandbox::command`] that also binds the host paths `read_only` (existing folders or
    /// files, such as an agent program's own folder) read-only at the same places inside. A
    /// path already visible (under the system folders or under `dir`) is left as it is. A
    /// path that is not absolute, `/`, a folder holding `dir`, or one of the sandbox's own
    /// (`/tmp`, `/proc`, `/dev` and what lies under the latter two) is refused
    /// (`InvalidInput`): binding it would hide the sandbox's own folders or expose the host's.
    pub fn command_with(
        &self,
        dir: &Path,
        writable: bool,
        read_only: &[PathBuf],
        program: &str,
        args: &[&str],
    ) -> std::io::Result<(Command, Option<UidLease>)> {
        if let Some(path) = read_only.iter().find(|p| !bindable(p, dir)) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "`{}` cannot be bound into the sandbox: a read-only path must be absolute \
                     and must not be `/`, `/tmp`, under `/proc` or `/dev`, or hold the command's \
                     folder `{}`",
                    path.display(),
                    dir.display()
                ),
            ));
        }
        let lease = if self.privileged {
            let lease = UidLease::take(self.config.first_uid, self.config.uid_count);
            hand_over(dir, lease.uid)?;
            Some(lease)
        } else {
            None
        };
        let mut command = Command::new(&self.config.bwrap);
        command
            .args(self.bwrap_args(dir, writable, read_only, lease.as_ref().map(|l| l.uid)))
            .arg(program)
            .args(args)
            .env_clear()
            .envs(self.env())
            .current_dir(dir)
            .stdin(Stdio::null());
        Ok((command, lease))
    }

    /// The environment inside: the interpreter's folder first on `PATH`, the rest fixed.
    fn env(&self) -> BTreeMap<String, String> {
        let mut path = String::new();
        if let Some(dir) = self.python.parent() {
            path.push_str(&dir.display().to_string());
            path.push(':');
        }
        path.push_str(SYSTEM_PATH);
        let mut env = BTreeMap::new();
        for (key, value) in [
            ("PATH", path.as_str()),
            ("HOME", "/tmp"),
            ("TMPDIR", "/tmp"),
            ("USER", "sandbox"),
            ("LOGNAME", "sandbox"),
            ("LANG", "C.UTF-8"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
            ("PYTHONHASHSEED", "0"),
            ("PYTHONIOENCODING", "utf-8"),
            ("PYTHONNOUSERSITE", "1"),
        ] {
            env.insert(key.to_string(), value.to_string());
        }
        env
    }

    /// bwrap's arguments up to and including the helpers that set the user and the limits.
    fn bwrap_args(
        &self,
        dir: &Path,
        writable: bool,
        read_only: &[PathBuf],
        uid: Option<u32>,
    ) -> Vec<OsString> {
        let mut args = Args::default();
        args.flags(&["--unshare-ipc", "--unshare-pid"]);
        if !self.config.share_network {
            args.flag("--unshare-net");
        }
        args.flags(&[
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
        ]);
        if uid.is_none() {
            // Unprivileged: bwrap needs a user namespace; nothing inside may make another.
            args.flag("--unshare-user");
            if self.version >= (0, 8, 0) {
                args.flag("--disable-userns");
            }
        }
        for dir in SYSTEM_DIRS {
            let path = Path::new(dir);
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(path) {
                        args.flag("--symlink");
                        args.path(&target);
                        args.path(path);
                        args.mounted.insert(path.to_path_buf());
                    }
                }
                Ok(meta) if meta.is_dir() => args.bind("--ro-bind", path),
                _ => {}
            }
        }
        args.make_dir(Path::new("/etc"));
        for entry in ETC_ENTRIES {
            let path = Path::new("/etc").join(entry);
            if path.exists() {
                args.bind("--ro-bind", &path);
            }
        }
        // Python's own configuration folders (Debian's /etc/python3.11).
        if let Ok(entries) = std::fs::read_dir("/etc") {
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
                .map(|e| e.path())
                .collect();
            found.sort();
            for path in found {
                args.bind("--ro-bind", &path);
            }
        }
        for path in &self.python_dirs {
            args.bind("--ro-bind", path);
        }
        args.flags(&["--proc", "/proc", "--dev", "/dev"]);
        // A private /tmp, and a /dev/shm the user may write (multiprocessing's semaphores).
        for tmp in ["/tmp", "/dev/shm"] {
            args.flags(&["--perms", "1777"]);
            if self.version >= (0, 7, 0) {
                args.flag("--size");
                args.flag(&self.config.tmp_bytes.to_string());
            }
            args.flags(&["--tmpfs", tmp]);
        }
        args.mounted.insert(PathBuf::from("/tmp"));
        args.bind(if writable { "--bind" } else { "--ro-bind" }, dir);
        for path in read_only {
            args.bind("--ro-bind", path);
        }
        args.flag("--chdir");
        args.path(dir);
        if let Some(uid) = uid {
            // Root: keep only what `setpriv` needs to switch to the leased user; it drops the
            // rest, and bwrap's no-new-privileges flag keeps set-uid programs from gaining any.
            args.flags(&[
                "--cap-drop",
                "ALL",
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
                "--cap-add",
                "CAP_SETPCAP",
                "--",
            ]);
            args.path(&self.setpriv);
            args.flag(&format!("--reuid={uid}"));
            args.flag(&format!("--regid={uid}"));
            args.flags(&["--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]);
        }
        args.flag("--");
        args.path(&self.prlimit);
        let c = &self.config;
        args.flag(&format!("--cpu={}", c.cpu_seconds));
        args.flag(&format!("--as={}", c.address_space_bytes));
        args.flag(&format!("--nproc={}", c.max_processes));
        args.flag(&format!("--fsize={}", c.file_size_bytes));
        args.flags(&["--core=0", "--"]);
        args.args
    }

    /// Run the probe; `Err` says what failed and how to get a working sandbox.
    fn probe(&self) -> std::result::Result<(), String> {
        let how = HOW;
        let dir = tempfile::Builder::new()
            .prefix("harness-sandbox-probe-")
            .tempdir()
            .map_err(|e| format!("cannot create the probe's folder: {e}"))?;
        let root = dir
            .path()
            .canonicalize()
            .map_err(|e| format!("cannot resolve the probe's folder: {e}"))?;
        let python = self.python.display().to_string();
        let network = if self.config.share_network {
            "shared"
        } else {
            "isolated"
        };
        let (command, _lease) = self
            .command(&root, true, &python, &["-I", "-S", "-c", PROBE, network])
            .map_err(|e| format!("cannot prepare the sandbox probe: {e}; {how}"))?;
        let out =
            super::exec::run_command(command, Duration::from_secs(20), 4000).map_err(|e| {
                format!(
                    "the sandbox program `{}` could not be started ({e}); {how}",
                    self.config.bwrap
                )
            })?;
        if out.status == Some(0) && out.output.trim() == PROBE_OK {
            return Ok(());
        }
        Err(format!(
            "the sandbox probe (`{}` with `{python}`) failed: {}; {how}",
            self.config.bwrap,
            out.describe().trim()
        ))
    }
}

/// bwrap arguments, with the folders already created or mounted inside so that parents of a
/// bind are made once, world-readable (bwrap would otherwise copy their host permissions, and
/// a parent such as `/root` would shut the sandbox's user out).
#[derive(Default)]
struct Args {
    args: Vec<OsString>,
    mounted: BTreeSet<PathBuf>,
}

impl Args {
    fn flag(&mut self, flag: &str) {
        self.args.push(flag.into());
    }

    fn flags(&mut self, flags: &[&str]) {
        self.args.extend(flags.iter().map(OsString::from));
    }

    fn path(&mut self, path: &Path) {
        self.args.push(path.as_os_str().to_owned());
    }

    fn covered(&self, path: &Path) -> bool {
        self.mounted
            .iter()
            .any(|m| path.starts_with(m) && m.as_path() != Path::new("/tmp"))
    }

    /// Create `path` (and its parents) as a folder inside, unless it already exists there.
    fn make_dir(&mut self, path: &Path) {
        if path == Path::new("/") || self.covered(path) || self.mounted.contains(path) {
            return;
        }
        if let Some(parent) = path.parent() {
            self.make_dir(parent);
        }
        self.flags(&["--perms", "0755", "--dir"]);
        self.path(path);
        self.mounted.insert(path.to_path_buf());
    }

    /// Bind `path` of the host at the same place inside (`--bind` or `--ro-bind`).
    fn bind(&mut self, how: &str, path: &Path) {
        if self.covered(path) {
            return;
        }
        if let Some(parent) = path.parent() {
            self.make_dir(parent);
        }
        self.flag(how);
        self.path(path);
        self.path(path);
        self.mounted.insert(path.to_path_buf());
    }
}

/// Whether `path` may be bound read-only beside the command's folder `dir` (see
/// [`Sandbox::command_with`]).
fn bindable(path: &Path, dir: &Path) -> bool {
    path.is_absolute()
        && path != Path::new("/")
        && path != Path::new("/tmp")
        && !path.starts_with("/proc")
        && !path.starts_with("/dev")
        && !dir.starts_with(path)
}

/// A program of the system folders, by its path.
fn system_program(name: &str) -> std::result::Result<PathBuf, String> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            format!(
                "`{name}` (util-linux) is not in /usr/bin, /bin, /usr/sbin or /sbin; the sandbox \
                 runs it to set the user and the limits; install util-linux"
            )
        })
}

/// bwrap's version (`bubblewrap 0.8.0`), which also shows that it can be started.
fn bwrap_version(bwrap: &str) -> std::result::Result<(u32, u32, u32), String> {
    let dir = std::env::temp_dir();
    let env = BTreeMap::from([("PATH".to_string(), SYSTEM_PATH.to_string())]);
    let out = super::exec::run_limited(
        bwrap,
        &["--version"],
        &dir,
        &env,
        Duration::from_secs(10),
        1000,
    )
    .map_err(|e| format!("the sandbox program `{bwrap}` could not be started ({e}); {HOW}"))?;
    let numbers: Vec<u32> = out
        .output
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .split('.')
        .map_while(|n| n.parse().ok())
        .collect();
    match (out.status, numbers.as_slice()) {
        (Some(0), [major, minor, patch, ..]) => Ok((*major, *minor, *patch)),
        (Some(0), [major, minor]) => Ok((*major, *minor, 0)),
        _ => Err(format!(
            "`{bwrap} --version` did not print a bubblewrap version ({}); {HOW}",
            out.describe().trim()
        )),
    }
}

/// The interpreter's `sys.executable` and the folders of its installation that lie outside the
/// system folders (a pyenv or venv tree), asked of the interpreter itself.
fn resolve_python(python: &str) -> std::result::Result<(PathBuf, Vec<PathBuf>), String> {
    let script = "import sys\nfor p in (sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):\n    print(p)\n";
    let dir = std::env::temp_dir();
    let out = super::exec::run_limited(
        python,
        &["-I", "-S", "-c", script],
        &dir,
        &super::exec::command_env(&dir),
        Duration::from_secs(20),
        8000,
    )
    .map_err(|e| format!("cannot start the Python interpreter `{python}`: {e}"))?;
    let lines: Vec<&str> = out.output.lines().collect();
    if out.status != Some(0) || lines.len() != 5 || lines.iter().any(|l| !l.starts_with('/')) {
        return Err(format!(
            "the Python interpreter `{python}` did not report its installation: {}",
            out.describe().trim()
        ));
    }
    let executable = PathBuf::from(lines[0]);
    let mut candidates: Vec<PathBuf> = lines[1..].iter().map(PathBuf::from).collect();
    if let Some(dir) = executable.parent() {
        candidates.push(dir.to_path_buf());
    }
    if let Ok(real) = executable.canonicalize()
        && let Some(dir) = real.parent()
    {
        candidates.push(dir.to_path_buf());
    }
    let system: Vec<PathBuf> = SYSTEM_DIRS
        .iter()
        .filter_map(|d| Path::new(d).canonicalize().ok())
        .collect();
    let outside = |p: &Path| {
        let real = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        !system.iter().any(|s| real.starts_with(s))
    };
    let mut dirs: Vec<PathBuf> = candidates.into_iter().filter(|p| outside(p)).collect();
    dirs.sort();
    dirs.dedup();
    // Keep the outermost of nested folders.
    let kept: Vec<PathBuf> = dirs
        .iter()
        .filter(|p| !dirs.iter().any(|q| q != *p && p.starts_with(q)))
        .cloned()
        .collect();
    Ok((executable, kept))
}

/// A user id leased to one running sandbox (root only); returned when dropped.
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
}

static LEASED: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
static NEXT_UID: AtomicU32 = AtomicU32::new(0);

impl UidLease {
    /// The next free id of `first..first + count`; when every one is in use, the next one
    /// anyway (two sandboxes then share a process count).
    fn take(first: u32, count: u32) -> UidLease {
        let mut leased = LEASED.lock().unwrap_or_else(|e| e.into_inner());
        let start = NEXT_UID.fetch_add(1, Ordering::Relaxed) % count;
        let pick = (0..count)
            .map(|i| first + (start + i) % count)
            .find(|uid| !leased.contains(uid))
            .unwrap_or(first + start);
        leased.insert(pick);
        UidLease { uid: pick }
    }

    /// The leased user id.
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        LEASED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.uid);
    }
}

/// Give `dir` and everything under it (links themselves, never their targets) to `uid`.
fn hand_over(dir: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid))?;
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if std::fs::symlink_metadata(&path)?.is_dir() {
                hand_over(&path, uid)?;
            } else {
                std::os::unix::fs::lchown(&path, Some(uid), Some(uid))?;
            }
        }
    }
    Ok(())
}

/// Mark this process non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`): its `/proc/<pid>` files
/// (`environ`, `mem`, `fd`) become root's and other processes of the same user can no longer
/// attach to it or read them; no core dumps are written. It holds until the process ends and
/// is not inherited across `exec`. A process-wide decision, so binaries call it at start-up.
#[allow(unsafe_code)]
pub fn set_non_dumpable() -> std::io::Result<()> {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integer arguments and touches no memory of
    // this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether this process is dumpable (`prctl(PR_GET_DUMPABLE)`).
#[allow(unsafe_code)]
pub fn is_dumpable() -> bool {
    // SAFETY: PR_GET_DUMPABLE reads a flag of the calling process; no pointers are involved.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 1 }
}

/// Whether the effective user is root.
#[allow(unsafe_code)]
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked_by_name() {
        assert!(SandboxConfig::default().check("swe.sandbox").is_ok());
        let bad = SandboxConfig {
            max_processes: 1,
            ..SandboxConfig::default()
        };
        let (field, message) = bad.check("swe.sandbox").unwrap_err();
        assert_eq!(field, "swe.sandbox.max_processes");
        assert!(message.contains("at least 4"), "{message}");
        let root = SandboxConfig {
            first_uid: 0,
            ..SandboxConfig::default()
        };
        assert_eq!(root.check("s").unwrap_err().0, "s.first_uid");
        let wrap = SandboxConfig {
            first_uid: u32::MAX - 1,
            uid_count: 5,
            ..SandboxConfig::default()
        };
        assert_eq!(wrap.check("s").unwrap_err().0, "s.uid_count");
    }

    #[test]
    fn leases_are_unique_while_held() {
        let held: Vec<UidLease> = (0..5).map(|_| UidLease::take(70_000, 5)).collect();
        let ids: BTreeSet<u32> = held.iter().map(|l| l.uid).collect();
        assert_eq!(ids.len(), 5);
        assert!(ids.iter().all(|u| (70_000..70_005).contains(u)));
        drop(held);
        let again = UidLease::take(70_000, 5);
        assert!((70_000..70_005).contains(&again.uid()));
    }

    #[test]
    fn parents_of_binds_are_made_once_and_covered_paths_skipped() {
        let mut args = Args::default();
        args.bind("--ro-bind", Path::new("/usr"));
        args.bind("--ro-bind", Path::new("/usr/lib/python3"));
        args.bind("--ro-bind", Path::new("/root/.pyenv/versions/3.11.7"));
        args.bind("--bind", Path::new("/work/tmp/copy"));
        let text: Vec<String> = args
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let dirs: Vec<&String> = text
            .iter()
            .zip(text.iter().skip(1))
            .filter(|(a, _)| *a == "--dir")
            .map(|(_, b)| b)
            .collect();
        assert_eq!(
            dirs,
            [
                "/root",
                "/root/.pyenv",
                "/root/.pyenv/versions",
                "/work",
                "/work/tmp"
            ]
        );
        assert_eq!(text.iter().filter(|a| *a == "/usr/lib/python3").count(), 0);
    }
}
