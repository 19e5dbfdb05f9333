//! Live restore: what a daemon started with `--live-restore` writes about each sandbox, so that
//! the next daemon can take it back, and how that daemon decides whether to trust it.
//!
//! One record per sandbox, `STATE_DIR/records/<id>.json`, written atomically (a new file, fsync,
//! rename, fsync of the directory) when the sandbox is handed to its client, removed when it is
//! destroyed. Only root can reach it (the directory is 0700, the file 0600); a sandbox's own
//! root never can (it sees none of the host's filesystem). Reading is suspicious all the same:
//! a file that is not a regular root-owned 0600 file, is too big, does not parse, has another
//! version or names another sandbox is not a record, and its sandbox is cleaned up, never
//! adopted. Everything the daemon derives from a sandbox's id (its runtime directory, cgroups,
//! agent socket) is derived again, never read from the record.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use wire::agent::Hello;

use crate::ids::is_valid_id;
use crate::owner::Owner;

/// The record format this daemon writes and reads (2: the host's boot id, an imported image's
/// tree, the devices' logs).
pub const RECORD_VERSION: u32 = 2;

/// A record larger than this is not one of ours.
const MAX_RECORD_BYTES: u64 = 256 * 1024;

/// Why a record or its sandbox cannot be adopted.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The record file cannot be trusted or read.
    #[error("its record {path}: {why}")]
    Record {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The sandbox is not as recorded.
    #[error("{0}")]
    Mismatch(String),
    /// This daemon cannot take such a sandbox back.
    #[error("{0}")]
    Unsupported(String),
    /// Writing a record failed.
    #[error("writing the record {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Who a sandbox belongs to, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RecordedOwner {
    /// The Unix socket without a key.
    Unix,
    /// The key of this name.
    Key(String),
}

impl From<&Owner> for RecordedOwner {
    fn from(owner: &Owner) -> Self {
        match owner {
            Owner::Unix => RecordedOwner::Unix,
            Owner::Key(name) => RecordedOwner::Key(name.to_string()),
        }
    }
}

impl From<RecordedOwner> for Owner {
    fn from(owner: RecordedOwner) -> Self {
        match owner {
            RecordedOwner::Unix => Owner::Unix,
            RecordedOwner::Key(name) => Owner::Key(name.into()),
        }
    }
}

/// What the backend must find to take a sandbox's processes back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceRecord {
    /// The supervisor: the sandbox's one process outside it (a namespace sandbox's
    /// supervisor; a microVM's VM process, `crucible-vmm` or QEMU).
    pub supervisor_pid: i32,
    /// Its start time (`/proc/PID/stat` field 22, clock ticks after boot): a pid the kernel
    /// gave to another process since has another start time.
    pub supervisor_start_ticks: u64,
    /// Its host id range's slot.
    pub id_slot: u32,
    /// Its agent's hello: the agent that answers must say exactly this again (its
    /// `uptime_ms` is when that agent became ready).
    pub hello: Hello,
    /// A microVM's hypervisor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor: Option<api_types::Hypervisor>,
    /// A microVM's other processes: its vhost-user devices under QEMU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<RecordedProcess>,
    /// A microVM's empty disks for containers added later (`container_slots`), by the
    /// container index their serial carries; all still empty, since adding a container ends
    /// the record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_slots: Vec<usize>,
}

/// One more process of a sandbox, as a restarted daemon must find it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedProcess {
    /// What it is, for messages ("the vsock device").
    pub what: String,
    /// Its pid.
    pub pid: i32,
    /// Its start time (`/proc/PID/stat` field 22).
    pub start_ticks: u64,
    /// The name of its log in the sandbox's directory (a file name, never a path: checked
    /// on read), quoted in the sandbox's exit reason when it dies.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub log: String,
}

impl RecordedProcess {
    /// `pid`'s record, or `None` when its start time cannot be read (it is gone); `log` is its
    /// log file, whose name is kept.
    pub(crate) fn of(what: &str, pid: Option<u32>, log: Option<&Path>) -> Option<Self> {
        let pid = i32::try_from(pid?).ok()?;
        Some(RecordedProcess {
            what: what.to_string(),
            pid,
            start_ticks: process_start_ticks(pid).ok()?,
            log: log
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        })
    }
}

/// What a daemon needs to take a sandbox back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxRecord {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// The sandbox's id.
    pub id: String,
    /// Who it belongs to (a key's name, never the key).
    pub owner: RecordedOwner,
    /// Its backend.
    pub backend: api_types::BackendKind,
    /// Its image's name.
    pub image: String,
    /// An imported image's tree (its chain digest's hex): the image of that name must still
    /// be this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_root: Option<String>,
    /// Memory limit.
    pub memory_mib: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// Lifetime, from `created_at_ms`.
    pub ttl_s: u64,
    /// Idle timeout.
    pub idle_s: u64,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Environment of every command.
    pub env: BTreeMap<String, String>,
    /// Most concurrent execs.
    pub max_execs: usize,
    /// Output the agent keeps per command.
    pub exec_tail_bytes: u64,
    /// When it was created (Unix milliseconds).
    pub created_at_ms: u64,
    /// How long its creation took.
    pub create_to_ready_ms: f64,
    /// Its commands' defaults (an imported image's config, the create request's `user`).
    pub defaults: Option<oci::defaults::Defaults>,
    /// The hosts its egress allows (empty: no network).
    pub network: Vec<String>,
    /// Its caches.
    pub caches: Vec<api_types::CacheMount>,
    /// Its volumes.
    pub volumes: Vec<api_types::VolumeMount>,
    /// Its disk-backed writable layer.
    pub disk_mib: Option<u64>,
    /// Whether its root and its containers share one PID namespace (absent in older records:
    /// they did not).
    #[serde(default)]
    pub share_process_namespace: bool,
    /// Its hostname, when the request gave one (absent in older records).
    #[serde(default)]
    pub hostname: Option<String>,
    /// The host's boot id (`/proc/sys/kernel/random/boot_id`) when it was written: after a
    /// reboot, pids and start times begin again and could match an unrelated process.
    pub boot_id: String,
    /// What its backend needs.
    pub instance: InstanceRecord,
}

/// This boot's id, or why it cannot be read (read once: it does not change).
pub fn boot_id() -> io::Result<String> {
    static BOOT_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(id) = BOOT_ID.get() {
        return Ok(id.clone());
    }
    let id = fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_string();
    Ok(BOOT_ID.get_or_init(|| id).clone())
}

/// Where the records live.
pub fn records_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("records")
}

fn record_path(state_dir: &Path, id: &str) -> PathBuf {
    records_dir(state_dir).join(format!("{id}.json"))
}

/// Writes `record` atomically: readers see the old file or the new one, never a part.
pub fn write(state_dir: &Path, record: &SandboxRecord) -> Result<(), RestoreError> {
    let dir = records_dir(state_dir);
    let path = record_path(state_dir, &record.id);
    let err = |source| RestoreError::Write {
        path: path.clone(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(err)?;
    let text = serde_json::to_vec_pretty(record).map_err(|e| err(io::Error::other(e)))?;
    let temp = dir.join(format!(".{}.json.new", record.id));
    let _ = fs::remove_file(&temp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&temp)
        .map_err(err)?;
    file.write_all(&text).map_err(err)?;
    file.sync_all().map_err(err)?;
    fs::rename(&temp, &path).map_err(err)?;
    fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(err)?;
    Ok(())
}

/// Removes `id`'s record, if it has one.
pub fn remove(state_dir: &Path, id: &str) {
    let path = record_path(state_dir, id);
    if let Err(e) = fs::remove_file(&path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!("remove {}: {e}", path.display());
        }
    }
}

/// Every record in `state_dir`, each read and checked: `(id, record or why not)`. A file whose
/// name is not `<sandbox id>.json` is reported under its file name.
pub fn read_all(state_dir: &Path) -> Vec<(String, Result<SandboxRecord, RestoreError>)> {
    let dir = records_dir(state_dir);
    let Ok(entries) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found: Vec<(String, Result<SandboxRecord, RestoreError>)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                // A write that never finished: not a record.
                let _ = fs::remove_file(entry.path());
                return None;
            }
            let id = name.strip_suffix(".json").unwrap_or(&name).to_string();
            Some((id.clone(), read_checked(&entry.path(), &id)))
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// Reads one record, trusting nothing about it.
pub fn read_checked(path: &Path, id: &str) -> Result<SandboxRecord, RestoreError> {
    let bad = |why: String| RestoreError::Record {
        path: path.to_path_buf(),
        why,
    };
    if !is_valid_id(id) {
        return Err(bad("its name is not a sandbox id".into()));
    }
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
        .open(path)
        .map_err(|e| bad(format!("cannot open it: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| bad(format!("cannot stat it: {e}")))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let euid = fs::metadata("/proc/self")
        .map(|m| m.uid())
        .map_err(|e| bad(format!("cannot tell who we are: {e}")))?;
    if meta.uid() != euid {
        return Err(bad(format!("owned by uid {}, not {euid}", meta.uid())));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(bad(format!(
            "mode {:o}: group or others may touch it",
            meta.mode() & 0o777
        )));
    }
    if meta.len() > MAX_RECORD_BYTES {
        return Err(bad(format!("{} bytes, more than a record", meta.len())));
    }
    let mut text = Vec::new();
    Read::by_ref(&mut file)
        .take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| bad(format!("cannot read it: {e}")))?;
    let record: SandboxRecord =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not a record: {e}")))?;
    if record.version != RECORD_VERSION {
        return Err(bad(format!(
            "version {}, this daemon reads {RECORD_VERSION}",
            record.version
        )));
    }
    if record.id != id {
        return Err(bad(format!("it names sandbox {:?}", record.id)));
    }
    if record.instance.supervisor_pid <= 1 {
        return Err(bad(format!(
            "supervisor pid {}",
            record.instance.supervisor_pid
        )));
    }
    let this_boot = boot_id().map_err(|e| bad(format!("cannot read this boot's id: {e}")))?;
    if record.boot_id != this_boot {
        return Err(bad(format!(
            "written before the host rebooted (boot id {:?}, now {this_boot:?}): its pids name \
             other processes now",
            record.boot_id
        )));
    }
    let processes = std::iter::once((record.instance.supervisor_pid, "")).chain(
        record
            .instance
            .devices
            .iter()
            .map(|d| (d.pid, d.log.as_str())),
    );
    for (pid, log) in processes {
        if pid <= 1 {
            return Err(bad(format!("a process of pid {pid}")));
        }
        if log.contains('/') || log == ".." || log == "." {
            return Err(bad(format!("a device log {log:?} that is not a file name")));
        }
    }
    Ok(record)
}

/// When `pid` started (`/proc/PID/stat` field 22), or why it cannot be told: it is gone, or
/// it has exited and waits to be reaped (a zombie is no sandbox's supervisor any more).
pub fn process_start_ticks(pid: i32) -> io::Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(e.kind(), "it is gone")
        } else {
            e
        }
    })?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| io::Error::other("unparsable /proc/PID/stat"))?;
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return Err(io::Error::other("it has exited"));
    }
    // Field 3 (state) was the first; field 22 is the 19th after it.
    fields
        .nth(18)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| io::Error::other("unparsable /proc/PID/stat"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> SandboxRecord {
        SandboxRecord {
            version: RECORD_VERSION,
            id: id.into(),
            owner: RecordedOwner::Key("alice".into()),
            backend: api_types::BackendKind::Namespace,
            image: "default".into(),
            image_root: None,
            memory_mib: 512,
            vcpus: 1,
            ttl_s: 3600,
            idle_s: 1800,
            labels: BTreeMap::from([("job".into(), "1".into())]),
            env: BTreeMap::new(),
            max_execs: 128,
            exec_tail_bytes: 1 << 20,
            created_at_ms: 1_700_000_000_000,
            create_to_ready_ms: 4.5,
            defaults: None,
            network: Vec::new(),
            caches: Vec::new(),
            volumes: Vec::new(),
            disk_mib: None,
            share_process_namespace: false,
            hostname: None,
            boot_id: boot_id().expect("this boot's id"),
            instance: InstanceRecord {
                supervisor_pid: 4242,
                supervisor_start_ticks: 99,
                id_slot: 3,
                hello: Hello {
                    agent_version: "0.1.0".into(),
                    protocol: wire::agent::PROTOCOL_VERSION,
                    kernel_release: "6.1".into(),
                    uptime_ms: 12,
                    pid: 1,
                },
                hypervisor: None,
                devices: Vec::new(),
                container_slots: Vec::new(),
            },
        }
    }

    const ID: &str = "sb-0123456789abcdef";

    #[test]
    fn a_record_written_is_read_back_and_only_root_can_touch_it(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        write(dir.path(), &record(ID))?;
        let all = read_all(dir.path());
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].0, ID);
        assert_eq!(all[0].1.as_ref().ok(), Some(&record(ID)));
        let meta = fs::metadata(record_path(dir.path(), ID))?;
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(records_dir(dir.path()))?.mode() & 0o777, 0o700);
        remove(dir.path(), ID);
        assert!(read_all(dir.path()).is_empty());
        Ok(())
    }

    #[test]
    fn a_tampered_truncated_or_foreign_record_is_refused_saying_why(
    ) -> Result<(), Box<dyn std::error::Error>> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        write(dir.path(), &record(ID))?;
        let path = record_path(dir.path(), ID);
        let whole = fs::read(&path)?;
        let refused = |path: &Path, id: &str| match read_checked(path, id) {
            Err(e) => report::chain(&e),
            Ok(r) => panic!("accepted {r:?}"),
        };

        fs::write(&path, &whole[..whole.len() / 2])?;
        assert!(refused(&path, ID).contains("not a record"));

        fs::write(&path, &whole)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
        assert!(refused(&path, ID).contains("mode 644"));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;

        let other = "sb-fedcba9876543210";
        let moved = record_path(dir.path(), other);
        fs::rename(&path, &moved)?;
        assert!(refused(&moved, other).contains(&format!("it names sandbox \"{ID}\"")));

        let link = record_path(dir.path(), ID);
        std::os::unix::fs::symlink(&moved, &link)?;
        assert!(refused(&link, ID).contains("cannot open it"));
        fs::remove_file(&link)?;

        let put = |bytes: &[u8]| -> std::io::Result<()> {
            fs::write(&path, bytes)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
        };
        let mut future = record(ID);
        future.version = RECORD_VERSION + 1;
        put(&serde_json::to_vec(&future)?)?;
        assert!(refused(&path, ID).contains(&format!("version {}", RECORD_VERSION + 1)));

        let mut rebooted = record(ID);
        rebooted.boot_id = "00000000-0000-0000-0000-000000000000".into();
        put(&serde_json::to_vec(&rebooted)?)?;
        assert!(refused(&path, ID).contains("before the host rebooted"));

        let mut escaping = record(ID);
        escaping.instance.devices.push(RecordedProcess {
            what: "the vsock device".into(),
            pid: 4243,
            start_ticks: 1,
            log: "../../etc/shadow".into(),
        });
        put(&serde_json::to_vec(&escaping)?)?;
        assert!(refused(&path, ID).contains("not a file name"));

        let extra = String::from_utf8(whole.clone())?.replacen('{', "{\"trust_me\": true,", 1);
        put(extra.as_bytes())?;
        assert!(refused(&path, ID).contains("unknown field"));

        assert!(refused(&dir.path().join("x.json"), "x").contains("not a sandbox id"));
        Ok(())
    }

    #[test]
    fn a_process_start_time_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        let ticks = process_start_ticks(me).expect("our own start time");
        assert!(ticks > 0);
        assert_eq!(process_start_ticks(me).ok(), Some(ticks), "stable");
        assert!(process_start_ticks(i32::MAX).is_err(), "no such process");
    }
}
