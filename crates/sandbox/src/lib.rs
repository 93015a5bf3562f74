//! A sandbox for untrusted commands (the policy's code in the repository-repair world, agent
//! programs): Linux namespaces through
//! bubblewrap (`bwrap`), resource limits through `prlimit`, a seccomp filter, and (when the
//! trainer runs as root) a user namespace made for each command and an unprivileged user
//! through `setpriv`.
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
//! `RLIMIT_NPROC` counts the processes of a user, and the kernel does not enforce it for the
//! host's root. So when the trainer runs as root, bwrap keeps only the capabilities needed to
//! change user, and `setpriv` switches the command to a user of its own, leased from
//! [`SandboxConfig::first_uid`].. for the command's lifetime: no two running sandboxes share
//! one. The directory the command may use is handed to that user (`chown`). Otherwise bwrap
//! runs unprivileged in a new user namespace, where the limit counts the processes of that
//! namespace.
//!
//! # Nothing kept between runs
//! A command must find nothing in the kernel that an earlier one left, since a verifier run
//! sees the hidden tests and a later episode must not. The kernel keeps some state per user
//! and user namespace, outside every other namespace: above all the user's keyrings
//! (`add_key`), which outlive the process that filled them. So every command runs in a user
//! namespace of its own ([`SandboxConfig::own_user_namespace`]). As root, the trainer makes it
//! for the command (`user_namespace`): bwrap (`--userns`) would otherwise map the sandbox's
//! user to the host's root, exempt from the process limit. Only root (for bwrap's set-up,
//! left by `setpriv` before the command starts) and the leased user are mapped, each to
//! itself, so the command's processes are the leased user on the host, counted against
//! `RLIMIT_NPROC` per namespace. Each command also gets a new session keyring (the trainer's
//! would otherwise be shared by all), and its own IPC namespace (System V IPC, POSIX message
//! queues) and, unless the network is shared, its own network namespace (abstract sockets).
//!
//! On top, a seccomp filter ([`seccomp_program`], [`SandboxConfig::seccomp`]) refuses with
//! `EPERM` what no test needs and what reaches state or processes outside the command: the
//! keyring calls, `ptrace` and `process_vm_*`, `bpf`, `perf_event_open`, every mount call,
//! `unshare`, `setns` and namespace flags on `clone` (`clone3` gets `ENOSYS`, so the C
//! library falls back to `clone`), and io_uring.
//!
//! # Probe
//! [`Sandbox::new`] resolves the Python interpreter, then runs a probe inside a sandbox built
//! exactly like the real ones and checks from inside that the user is unprivileged (not root,
//! no capabilities, no supplementary groups), that it has a user namespace of its own in which
//! it is not the host's root (`/proc/self/uid_map`), that the seccomp filter is loaded, that
//! the system is read-only, the directory is writable and, unless it is shared, there is no
//! network. When bwrap is missing or the probe fails, it returns an error that says how to
//! install bubblewrap.
//!
//! The trainer's own environment (API keys) is kept out of the sandbox by the empty environment
//! and the pid namespace; [`set_non_dumpable`] also keeps it from processes of the same user
//! outside any sandbox. Binaries call it at start-up; it is a process-wide decision.
//!
//! # Limited commands
//! [`exec`] runs a prepared command (sandboxed or not) in its own process group with a time
//! limit and an output cap, optionally with a report channel kept apart from its output.

// The sandbox uses Linux namespaces, prctl, close_range and seccomp: on another target the
// build stops here with that reason instead of in the system calls.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "harness-sandbox builds on Linux only: it uses Linux namespaces, prctl, close_range and seccomp (bubblewrap)."
);

pub mod exec;
mod sandbox;

pub use sandbox::{
    Sandbox, SandboxConfig, UidLease, is_dumpable, seccomp_program, set_non_dumpable,
};

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
