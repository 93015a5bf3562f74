//! Small file-system helpers shared by the crates that write run artefacts.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Tells apart the temporary files of one process's concurrent writes (the pid tells apart
/// processes).
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// How many names [`write_atomic`] tries before giving up (a name is taken only when a crashed
/// process with the same pid left its temporary file behind).
const TEMP_ATTEMPTS: u32 = 100;

/// Append `record` as one JSON line to `path`, creating the file and its folder if needed.
pub fn append_json_line<T: serde::Serialize>(path: &Path, record: &T) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let mut line = serde_json::to_string(record).unwrap_or_else(|_| unreachable!("plain data"));
    line.push('\n');
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .map_err(|e| Error::io(path, e))
}

/// Write `bytes` to `path` atomically: a temporary file in the same directory, flushed and
/// synced, then renamed over the target and the directory synced, so readers never see a
/// half-written file and a crash after the return never loses it.
///
/// Every call writes its own temporary file (the pid, a process-wide counter, created with
/// `create_new`), so concurrent writers of one path never write into each other's file: the
/// last rename wins, whole.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (tmp, mut file) = create_temp(dir, &file_name).map_err(|e| Error::io(path, e))?;
    let result = (|| {
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(path, e));
    }
    sync_dir(dir).map_err(|e| Error::io(dir, e))
}

/// A new temporary file beside the target, with a name no other call uses.
fn create_temp(dir: &Path, file_name: &str) -> std::io::Result<(PathBuf, File)> {
    let mut last = None;
    for _ in 0..TEMP_ATTEMPTS {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{file_name}.tmp-{}-{n}", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temporary file name")))
}

/// Make a rename or a new file in `dir` durable: on Unix a directory's entries reach the disk
/// only when the directory itself is synced. Elsewhere there is nothing to do.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// An exclusive advisory lock on a run folder, held until it is dropped: the file
/// [`DirLock::FILE`] in the folder, locked with the operating system's file lock (`flock` on
/// Unix), so the lock goes with the process that holds it, even if it is killed.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    dir: PathBuf,
}

impl DirLock {
    /// The lock file's name inside the folder.
    pub const FILE: &'static str = ".lock";

    /// Lock `dir` (created if missing), or fail at once, naming the folder, when another run
    /// holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let path = dir.join(Self::FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock {
                _file: file,
                dir: dir.to_path_buf(),
            }),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::io(
                dir,
                std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    format!(
                        "another run holds this folder (its lock file {} is locked); wait for \
                         that run to end or stop it, or use another folder",
                        path.display()
                    ),
                ),
            )),
            Err(std::fs::TryLockError::Error(e)) => Err(Error::io(&path, e)),
        }
    }

    /// The locked folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two threads writing one path at once: every write succeeds, a reader always finds the
    /// file whole (one writer's bytes, never a mix or a cut), and no temporary file is left.
    #[test]
    fn concurrent_writers_of_one_path_never_tear_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let payload = |writer: u8| vec![b'a' + writer; 256 * 1024];
        write_atomic(&path, &payload(0)).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let mut reads = 0;
                while !done.load(Ordering::Relaxed) || reads == 0 {
                    let bytes = std::fs::read(&path).expect("the file is always there");
                    assert_eq!(bytes.len(), 256 * 1024, "a torn file");
                    assert!(bytes.iter().all(|b| *b == bytes[0]), "a mixed file");
                    reads += 1;
                }
            });
            let writers: Vec<_> = (0..2u8)
                .map(|writer| {
                    let path = &path;
                    scope.spawn(move || {
                        for _ in 0..100 {
                            write_atomic(path, &payload(writer)).unwrap();
                        }
                    })
                })
                .collect();
            let written: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
            done.store(true, Ordering::Relaxed);
            reader.join().unwrap();
            for result in written {
                result.unwrap();
            }
        });
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
    }

    #[test]
    fn a_second_lock_on_a_folder_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("train").join("grpo");
        let first = DirLock::acquire(&run).unwrap();
        assert_eq!(first.dir(), run);
        let err = DirLock::acquire(&run).unwrap_err().to_string();
        assert!(err.contains(&run.display().to_string()), "{err}");
        assert!(err.contains("another run holds this folder"), "{err}");
        drop(first);
        DirLock::acquire(&run).unwrap();
    }
}
