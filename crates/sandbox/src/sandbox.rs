//! The sandbox itself: its settings, the probe, the command line and the process set-up.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
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
    /// When the trainer runs as root: give every command a user namespace of its own, made
    /// fresh for it, in which only root (for bwrap's set-up) and the leased user are mapped,
    /// each to itself. Nothing a command leaves in the kernel that is kept per user namespace
    /// (the user's keyrings, in particular) reaches a later command. **Unsafe** to turn off:
    /// commands then share the host's user namespace, and what one run stores in its user's
    /// keyring a later run with the same leased user reads back. A trainer that does not run
    /// as root always gives bwrap a user namespace of its own, whatever this says.
    pub own_user_namespace: bool,
    /// Load a seccomp filter ([`seccomp_program`]) that refuses, with `EPERM`, the kernel
    /// keyring calls, `ptrace`, `bpf`, `perf_event_open`, mounting, `unshare`, `setns` and
    /// namespace flags on `clone` (and makes `clone3` fail with `ENOSYS`, so that the C
    /// library falls back to `clone`). **Unsafe** to turn off.
    pub seccomp: bool,
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
            own_user_namespace: true,
            seccomp: true,
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

/// The probe: checks from inside what the sandbox promises. Its arguments name the further
/// promises to check: `isolated` (no network), `userns` (a user namespace of its own, where
/// the command's user is not the host's root), `seccomp` (a seccomp filter).
const PROBE: &str = r#"
import os, socket, sys
problems = []
promises = sys.argv[1:]
if os.getuid() == 0 or os.geteuid() == 0:
    problems.append("the command runs as root")
extra = set(os.getgroups()) - {os.getgid()}
if extra:
    problems.append("the command keeps supplementary groups %s" % sorted(extra))
status = {}
with open("/proc/self/status") as handle:
    for line in handle:
        key, _, value = line.partition(":")
        status[key] = value.strip()
if int(status.get("CapEff", "0"), 16) != 0:
    problems.append("the command has capabilities: CapEff " + status["CapEff"])
if "seccomp" in promises and status.get("Seccomp") != "2":
    problems.append("no seccomp filter (Seccomp: %s)" % status.get("Seccomp"))
if "userns" in promises:
    with open("/proc/self/uid_map") as handle:
        rows = [[int(x) for x in line.split()] for line in handle if line.strip()]
    uid = os.getuid()
    host = [outer + uid - inner for inner, outer, count in rows if inner <= uid < inner + count]
    if any(count == 4294967295 for _, _, count in rows):
        problems.append("the command shares the host's user namespace")
    elif not host or host[0] == 0:
        problems.append("the command's user is the host's root")
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
if "isolated" in promises:
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
    ///
    /// The command gets no descriptor of the trainer's beyond stdin, stdout and stderr: every
    /// other one is closed at `exec` (a caller that means to hand one on clears its
    /// close-on-exec flag in a `pre_exec` of its own, which runs after this one's).
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
        let uid = lease.as_ref().map(|l| l.uid);
        // Root: a user namespace made for this command alone (see the module docs).
        let userns = match uid {
            Some(uid) if self.config.own_user_namespace => Some(user_namespace(uid)?),
            _ => None,
        };
        let filter = if self.config.seccomp {
            Some(seccomp_fd()?)
        } else {
            None
        };
        let fds = KernelFds {
            userns: userns.as_ref().map(AsRawFd::as_raw_fd),
            seccomp: filter.as_ref().map(AsRawFd::as_raw_fd),
        };
        let mut command = Command::new(&self.config.bwrap);
        command
            .args(self.bwrap_args(dir, writable, read_only, uid, fds))
            .arg(program)
            .args(args)
            .env_clear()
            .envs(self.env())
            .current_dir(dir)
            .stdin(Stdio::null());
        let gid = uid.filter(|_| fds.userns.is_some());
        let owned = (userns, filter);
        let prepare = move || {
            // The closure owns the descriptors, so they stay open as long as the command.
            let _held = &owned;
            prepare_child(fds, gid)
        };
        // SAFETY: `prepare_child` makes only async-signal-safe system calls (fcntl, lseek,
        // keyctl, setgroups, setresgid) and allocates nothing, as code between fork and exec
        // must.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(prepare);
        }
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
        fds: KernelFds,
    ) -> Vec<OsString> {
        let mut args = Args::default();
        if let Some(fd) = fds.seccomp {
            args.flag("--seccomp");
            args.flag(&fd.to_string());
        }
        if let Some(fd) = fds.userns {
            // Root with a user namespace made for this command: bwrap joins it before it
            // makes the other namespaces, so they belong to it.
            args.flag("--userns");
            args.flag(&fd.to_string());
        }
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
            // In a namespace of the command's own these are capabilities over that namespace
            // only, held by bwrap's root until `setpriv` runs.
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
        let mut args = vec!["-I", "-S", "-c", PROBE];
        if !self.config.share_network {
            args.push("isolated");
        }
        if !self.privileged || self.config.own_user_namespace {
            args.push("userns");
        }
        if self.config.seccomp {
            args.push("seccomp");
        }
        let (command, _lease) = self
            .command(&root, true, &python, &args)
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

/// The descriptors a sandboxed command hands to bwrap, by their numbers (the same in the
/// child, where [`prepare_child`] lets them survive `exec`).
#[derive(Debug, Clone, Copy, Default)]
struct KernelFds {
    /// The user namespace made for the command ([`user_namespace`]), for `--userns`.
    userns: Option<RawFd>,
    /// The seccomp program ([`seccomp_fd`]), for `--seccomp`.
    seccomp: Option<RawFd>,
}

/// `keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)`: join a new anonymous session keyring.
const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;

/// Run in the child between `fork` and bwrap's `exec`: close at `exec` every descriptor
/// beyond stdin, stdout and stderr that the trainer holds without close-on-exec (one it
/// inherited from whatever started it, such as a pipe to its parent, would otherwise reach
/// every sandbox, a channel between runs and out of them); let the descriptors bwrap reads
/// survive the `exec` (they are opened close-on-exec, so no other child of the trainer gets
/// them); give the command a session keyring of its own (it would otherwise share the
/// trainer's, which every sandbox possesses); and, with a user namespace made for the command,
/// drop root's supplementary groups and take the leased group, so that bwrap starts with
/// nothing of root's group ids (they would count inside, mapped or not).
#[allow(unsafe_code)]
fn prepare_child(fds: KernelFds, gid: Option<u32>) -> std::io::Result<()> {
    let check = |rc: libc::c_long| {
        if rc == -1 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: close_range only sets flags on descriptor numbers; no memory is touched.
    let marked = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if marked == -1 {
        // Before Linux 5.11: one descriptor at a time, up to the descriptor limit.
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the local it is given.
        check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }.into())?;
        let top = limit.rlim_cur.min(1 << 20) as libc::c_int;
        for fd in 3..top {
            // SAFETY: fcntl on a descriptor number (EBADF for a closed one is fine).
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
    for fd in [fds.userns, fds.seccomp].into_iter().flatten() {
        // SAFETY: fcntl on a descriptor number; no memory is touched.
        check(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }.into())?;
    }
    if let Some(fd) = fds.seccomp {
        // bwrap reads the program from the descriptor's offset, shared with the parent.
        // SAFETY: lseek on a descriptor number; no memory is touched.
        check(unsafe { libc::lseek(fd, 0, libc::SEEK_SET) })?;
    }
    // SAFETY: keyctl with a null name pointer, which the kernel reads as "anonymous".
    let joined = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    };
    if joined == -1 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
        return Err(std::io::Error::last_os_error());
    }
    if let Some(gid) = gid {
        // SAFETY: setgroups with an empty list reads no memory; setresgid takes integers.
        check(unsafe { libc::setgroups(0, std::ptr::null()) }.into())?;
        check(unsafe { libc::setresgid(gid, gid, gid) }.into())?;
    }
    Ok(())
}

/// A user namespace made for one command of the leased user `uid` (root only), as an open
/// descriptor for bwrap's `--userns`. Only two users are mapped, each to itself: root, which
/// bwrap needs to resolve and mount what it binds (a Python installation under `/root` is
/// reachable only by root) and which no process of the command ever is again (`setpriv`
/// leaves it, without capabilities, with no-new-privileges and no set-uid mounts); and the
/// leased user, whose processes the kernel counts against `RLIMIT_NPROC` (it exempts only
/// the host's root). Only the leased group is mapped. The kernel keeps the user keyrings per
/// user namespace, so a namespace no earlier command used holds none of their keys.
///
/// A short-lived child of the trainer makes the namespace (`unshare` is refused to a process
/// with threads): it unshares and reports, the trainer writes the maps, opens the namespace
/// and kills the child, and the descriptor keeps the namespace alive until bwrap has joined
/// it. The child is killed rather than told to exit through a pipe: a child forked at the
/// same time by another thread would hold that pipe open, and two such children would wait
/// on each other for ever.
#[allow(unsafe_code)]
fn user_namespace(uid: u32) -> std::io::Result<OwnedFd> {
    use std::io::{Read, Write};
    let (mut ready_reader, ready_writer) = std::io::pipe()?;
    let ready_w = ready_writer.as_raw_fd();
    // SAFETY: the child calls only async-signal-safe functions (close_range, unshare, write,
    // pause) on integers and stack bytes, allocates nothing and never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            // Let go at once of every descriptor but its report pipe (other commands' pipes
            // among them), so that nothing waits on this child.
            if ready_w > 3 {
                libc::syscall(
                    libc::SYS_close_range,
                    3 as libc::c_uint,
                    (ready_w - 1) as libc::c_uint,
                    0,
                );
            }
            libc::syscall(
                libc::SYS_close_range,
                (ready_w + 1) as libc::c_uint,
                libc::c_uint::MAX,
                0,
            );
            let errno: i32 = if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            let bytes = errno.to_ne_bytes();
            libc::write(ready_w, bytes.as_ptr().cast(), bytes.len());
            loop {
                libc::pause();
            }
        }
    }
    drop(ready_writer);
    let made = (|| {
        let mut bytes = [0u8; 4];
        ready_reader.read_exact(&mut bytes)?;
        let errno = i32::from_ne_bytes(bytes);
        if errno != 0 {
            let cause = std::io::Error::from_raw_os_error(errno);
            return Err(std::io::Error::new(
                cause.kind(),
                format!("cannot make a user namespace for the sandbox: {cause}"),
            ));
        }
        // Each map in one write, as the kernel requires.
        let map = |name: &str, text: String| -> std::io::Result<()> {
            let path = format!("/proc/{pid}/{name}");
            let mut file = std::fs::OpenOptions::new().write(true).open(&path)?;
            file.write_all(text.as_bytes())
                .map_err(|e| std::io::Error::new(e.kind(), format!("cannot write `{path}`: {e}")))
        };
        map("uid_map", format!("0 0 1\n{uid} {uid} 1\n"))?;
        map("gid_map", format!("{uid} {uid} 1\n"))?;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
        Ok(OwnedFd::from(ns))
    })();
    let mut status = 0;
    // SAFETY: kill and waitpid on our own child, with a valid pointer to a local.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    while unsafe { libc::waitpid(pid, &mut status, 0) } == -1
        && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
    {}
    made
}

/// The seccomp program in a memory file, for bwrap's `--seccomp`.
#[allow(unsafe_code)]
fn seccomp_fd() -> std::io::Result<OwnedFd> {
    use std::io::Write;
    let program = seccomp_program().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::Unsupported, NO_SECCOMP.to_string())
    })?;
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked before use.
    let fd = unsafe { libc::memfd_create(c"harness-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(&program)?;
    Ok(OwnedFd::from(file))
}

/// Why there is no seccomp filter on this machine.
const NO_SECCOMP: &str = "the sandbox's seccomp filter is written for x86_64 and aarch64 only; \
    on this architecture set `seccomp = false` in the sandbox settings (unsafe: the kernel \
    keyring, ptrace, bpf, mount and namespace calls are then open to the policy's code)";

// Classic BPF, as `linux/filter.h` and `linux/seccomp.h` spell it.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_JSET_K: u16 = 0x45;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// Offsets in `struct seccomp_data`: the call's number, its architecture, the low 32 bits of
/// its first argument (both architectures are little-endian).
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARG0_LOW: u32 = 16;
/// The namespace flags of `clone` (`CLONE_NEWNS`, `NEWCGROUP`, `NEWUTS`, `NEWIPC`, `NEWUSER`,
/// `NEWPID`, `NEWNET`; `CLONE_NEWTIME` shares its bit with the exit signal and only
/// `unshare` and `clone3` take it, both refused whole).
const CLONE_NAMESPACES: u32 =
    0x0002_0000 | 0x0200_0000 | 0x0400_0000 | 0x0800_0000 | 0x1000_0000 | 0x2000_0000 | 0x4000_0000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_003E);
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_00B7);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AUDIT_ARCH: Option<u32> = None;

/// The calls the filter refuses with `EPERM`: the kernel keyrings (state kept per user,
/// outside any sandbox), tracing and reading other processes, eBPF and performance
/// counters, every way to mount (the old call and the new mount API), and namespaces, plus
/// io_uring, whose operations the filter would not see.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const REFUSED: &[libc::c_long] = &[
    libc::SYS_add_key,
    libc::SYS_keyctl,
    libc::SYS_request_key,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_pivot_root,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// Where a conditional jump of [`seccomp_program`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum To {
    Next,
    Allow,
    Refuse,
    NoSys,
    Kill,
}

/// The seccomp filter every sandboxed command runs under, as the bytes bwrap's `--seccomp`
/// reads (an array of `struct sock_filter`), or `None` on an architecture it is not written
/// for. A call of another architecture (a 32-bit program through `int 0x80`) kills the
/// process; on x86_64 every x32 call is refused with `EPERM`, so that a refused call cannot
/// come back under its x32 number. `clone3` fails with `ENOSYS` (its
/// flags lie in memory the filter cannot read), and the C library then uses `clone`, whose
/// namespace flags are refused.
pub fn seccomp_program() -> Option<Vec<u8>> {
    let insns = seccomp_insns()?;
    let mut bytes = Vec::with_capacity(insns.len() * 8);
    for insn in insns {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    Some(bytes)
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn seccomp_insns() -> Option<Vec<Insn>> {
    let arch = AUDIT_ARCH?;
    // The body with symbolic jump targets, resolved once its length is known.
    let mut body: Vec<(u16, To, To, u32)> = vec![
        (BPF_LD_W_ABS, To::Next, To::Next, DATA_ARCH),
        (BPF_JEQ_K, To::Next, To::Kill, arch),
        (BPF_LD_W_ABS, To::Next, To::Next, DATA_NR),
    ];
    if cfg!(target_arch = "x86_64") {
        // __X32_SYSCALL_BIT: x32 calls reach the same kernel functions under other numbers.
        body.push((BPF_JGE_K, To::Refuse, To::Next, 0x4000_0000));
    }
    for nr in REFUSED {
        body.push((BPF_JEQ_K, To::Refuse, To::Next, *nr as u32));
    }
    body.push((BPF_JEQ_K, To::NoSys, To::Next, libc::SYS_clone3 as u32));
    body.push((BPF_JEQ_K, To::Next, To::Allow, libc::SYS_clone as u32));
    body.push((BPF_LD_W_ABS, To::Next, To::Next, DATA_ARG0_LOW));
    body.push((BPF_JSET_K, To::Refuse, To::Allow, CLONE_NAMESPACES));
    let allow = body.len();
    let (refuse, nosys, kill) = (allow + 1, allow + 2, allow + 3);
    let mut insns = Vec::with_capacity(body.len() + 4);
    for (at, (code, jt, jf, k)) in body.iter().enumerate() {
        let offset = |to: To| -> u8 {
            let target = match to {
                To::Next => at + 1,
                To::Allow => allow,
                To::Refuse => refuse,
                To::NoSys => nosys,
                To::Kill => kill,
            };
            u8::try_from(target - at - 1).expect("the filter is short enough for 8-bit jumps")
        };
        insns.push(Insn {
            code: *code,
            jt: offset(*jt),
            jf: offset(*jf),
            k: *k,
        });
    }
    for k in [
        SECCOMP_RET_ALLOW,
        SECCOMP_RET_ERRNO | libc::EPERM as u32,
        SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        SECCOMP_RET_KILL_PROCESS,
    ] {
        insns.push(Insn {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k,
        });
    }
    Some(insns)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn seccomp_insns() -> Option<Vec<Insn>> {
    None
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

    /// Run the classic BPF program on one call, as the kernel would: its verdict.
    fn verdict(insns: &[Insn], arch: u32, nr: i64, arg0: u64) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        data[16..24].copy_from_slice(&arg0.to_ne_bytes());
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let insn = insns[pc];
            let jump = |taken: bool| pc + 1 + usize::from(if taken { insn.jt } else { insn.jf });
            pc = match insn.code {
                BPF_LD_W_ABS => {
                    let k = insn.k as usize;
                    acc = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap());
                    pc + 1
                }
                BPF_JEQ_K => jump(acc == insn.k),
                BPF_JGE_K => jump(acc >= insn.k),
                BPF_JSET_K => jump(acc & insn.k != 0),
                BPF_RET_K => return insn.k,
                other => panic!("unexpected instruction {other:#x}"),
            };
        }
    }

    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn the_seccomp_program_refuses_what_it_lists_and_allows_the_rest() {
        let insns = seccomp_insns().unwrap();
        let arch = AUDIT_ARCH.unwrap();
        let eperm = SECCOMP_RET_ERRNO | libc::EPERM as u32;
        // Every jump lands inside the program and it ends in a return, as the kernel checks.
        for (at, insn) in insns.iter().enumerate() {
            assert!(
                at + 1 + usize::from(insn.jt.max(insn.jf)) < insns.len() || insn.code == BPF_RET_K
            );
        }
        assert_eq!(insns.last().unwrap().code, BPF_RET_K);
        assert_eq!(seccomp_program().unwrap().len(), insns.len() * 8);
        for nr in REFUSED {
            assert_eq!(verdict(&insns, arch, *nr, 0), eperm, "call {nr}");
        }
        for name in [
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_ptrace,
            libc::SYS_bpf,
        ] {
            assert!(REFUSED.contains(&name));
        }
        // The control: ordinary calls, and a fork (`clone` without namespace flags), pass.
        let sigchld = libc::SIGCHLD as u64;
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_exit_group,
        ] {
            assert_eq!(verdict(&insns, arch, nr, 0), SECCOMP_RET_ALLOW, "call {nr}");
        }
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        for flags in [
            sigchld,
            thread,
            libc::CLONE_VM as u64 | libc::CLONE_VFORK as u64 | sigchld,
        ] {
            assert_eq!(
                verdict(&insns, arch, libc::SYS_clone, flags),
                SECCOMP_RET_ALLOW
            );
        }
        for flag in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
        ] {
            let flags = flag as u64 | sigchld;
            assert_eq!(
                verdict(&insns, arch, libc::SYS_clone, flags),
                eperm,
                "{flag:#x}"
            );
        }
        assert_eq!(
            verdict(&insns, arch, libc::SYS_clone3, 0),
            SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
        // Another architecture's calls are killed whatever their number.
        assert_eq!(
            verdict(&insns, 0x4000_0003, libc::SYS_read, 0),
            SECCOMP_RET_KILL_PROCESS
        );
        if cfg!(target_arch = "x86_64") {
            // An x32 call (a refused one under its x32 number, or any other) is refused.
            for nr in [libc::SYS_keyctl, libc::SYS_read] {
                assert_eq!(verdict(&insns, arch, nr | 0x4000_0000, 0), eperm);
            }
        }
    }

    /// The probe's new checks can fail: asked for a user namespace of its own and a seccomp
    /// filter in a sandbox built without them (as root), it names both; in the default
    /// sandbox it passes.
    #[test]
    fn the_probe_sees_a_shared_user_namespace_and_a_missing_filter() {
        let probe = |sandbox: &Sandbox| {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().canonicalize().unwrap();
            let python = sandbox.python().display().to_string();
            let args = ["-I", "-S", "-c", PROBE, "isolated", "userns", "seccomp"];
            let (command, _lease) = sandbox.command(&root, true, &python, &args).unwrap();
            let out = super::super::exec::run_command(command, Duration::from_secs(20), 4000);
            out.unwrap().output
        };
        let defended = Sandbox::new(&SandboxConfig::default(), "python3").unwrap();
        assert_eq!(probe(&defended).trim(), PROBE_OK);
        if !is_root() {
            // CI runs as root: there the control must run, never be skipped.
            assert!(
                // invariant-exception: a unit test's guard (CI runs as root), not configuration
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true but not root: the probe's control needs root and would be skipped"
            );
            return;
        }
        let open = SandboxConfig {
            own_user_namespace: false,
            seccomp: false,
            ..SandboxConfig::default()
        };
        let out = probe(&Sandbox::new(&open, "python3").unwrap());
        assert!(out.contains("shares the host's user namespace"), "{out}");
        assert!(out.contains("no seccomp filter"), "{out}");
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
