//! The network of a sandboxed agent program: a network namespace of its own (bubblewrap's
//! `--unshare-net`: a loopback device and nothing else), where only the environment server
//! and the recording proxy are reachable.
//!
//! Two halves carry a program's connections out:
//! - on the host, a [`Relay`] per episode listens on Unix sockets in a fresh folder and
//!   connects each connection to its server's TCP address; the folder is bound read-only into
//!   the sandbox, and nothing else of the host's network is. A relay holds at most
//!   [`MAX_CONNECTIONS`] connections per server at once (one more is closed at once), and it
//!   ends with the episode, taking every connection along;
//! - inside, [`FORWARDER`] (Python, standard library only: the sandbox always has the
//!   interpreter) listens on `127.0.0.1:<port>` for each server, with the server's own port,
//!   relays each connection to its Unix socket, and runs the program as its child, exiting
//!   as the program does (with its status, or by its signal).
//!
//! So a program reaches the servers at the URLs it is handed and nothing else: not the host's
//! other loopback services (a serving engine's weight-reload route, say), not the network. A
//! program that kills the forwarder, or floods it, cuts only its own connections.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{TcpStream, UnixListener};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

use crate::error::{Error, Result};

/// Connections one episode may hold open at once to each server through its relay.
pub const MAX_CONNECTIONS: usize = 16;

/// The forwarder run inside the sandbox: `python3 -c FORWARDER PORT SOCKET [PORT SOCKET ...]
/// -- PROGRAM ARGS...`.
pub const FORWARDER: &str = r#"
import os, signal, socket, subprocess, sys, threading

def pump(src, dst, done):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    with done[0]:
        done[1] += 1
        if done[1] == 2:
            src.close()
            dst.close()

def serve(listener, path):
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            continue
        done = [threading.Lock(), 0]
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b, done), daemon=True).start()

args = sys.argv[1:]
split = args.index("--")
routes, program = args[:split], args[split + 1:]
for i in range(0, len(routes), 2):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(routes[i])))
    listener.listen(64)
    threading.Thread(target=serve, args=(listener, routes[i + 1]), daemon=True).start()
child = subprocess.Popen(program)
code = child.wait()
sys.stdout.flush()
sys.stderr.flush()
if code < 0:
    try:
        signal.signal(-code, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), -code)
    code = 128 - code
os._exit(code)
"#;

/// One route of a relay: inside the sandbox, `127.0.0.1:port` leads to `socket`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The port the forwarder listens on inside (the server's own port).
    pub port: u16,
    /// The Unix socket on the host, bound read-only at the same path inside.
    pub socket: PathBuf,
}

/// The host half of a sandboxed program's network: Unix sockets in a fresh folder, each
/// relayed to one server's TCP address. Dropping it closes the sockets and every connection.
pub struct Relay {
    dir: tempfile::TempDir,
    routes: Vec<Route>,
    tasks: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Listen for `targets` (the servers' addresses), one socket each.
    pub async fn open(targets: &[SocketAddr]) -> Result<Relay> {
        let io = |path: &Path, source: std::io::Error| {
            Error::Core(harness_core::Error::Io {
                path: path.to_path_buf(),
                source,
            })
        };
        let dir = tempfile::Builder::new()
            .prefix("harness-relay-")
            .tempdir()
            .map_err(|e| io(&std::env::temp_dir(), e))?;
        // The sandbox's user (a leased uid when the runner is root) must reach the sockets.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io(dir.path(), e))?;
        let folder = dir.path().canonicalize().map_err(|e| io(dir.path(), e))?;
        let mut routes = Vec::new();
        let mut tasks = Vec::new();
        for (i, target) in targets.iter().enumerate() {
            let socket = folder.join(format!("{i}.sock"));
            let listener = UnixListener::bind(&socket).map_err(|e| io(&socket, e))?;
            std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
                .map_err(|e| io(&socket, e))?;
            routes.push(Route {
                port: target.port(),
                socket,
            });
            tasks.push(tokio::spawn(relay(listener, *target)));
        }
        Ok(Relay { dir, routes, tasks })
    }

    /// The routes, in the order of the targets.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The folder holding the sockets (bound read-only into the sandbox).
    pub fn folder(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Accept on `listener` and carry each connection to `target`, at most [`MAX_CONNECTIONS`] at
/// once; the connections' tasks end when this one is aborted (the [`JoinSet`] goes with it).
async fn relay(listener: UnixListener, target: SocketAddr) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let Ok((mut inside, _)) = accepted else {
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Over the bound: the connection is closed unanswered.
            drop(inside);
            continue;
        };
        connections.spawn(async move {
            let _permit = permit;
            if let Ok(mut outside) = TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
            }
        });
    }
}
