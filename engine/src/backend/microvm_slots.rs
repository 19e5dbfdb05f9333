//! Containers added to a running microVM. A microVM's disks are fixed when it boots, so a
//! sandbox created with `container_slots` boots with that many empty read-only disks (serials
//! `crucible-ctr-N` after its containers'). Adding a container fills the next one: the daemon
//! opens the image's ext4 snapshot and hands the descriptor to the disk's device through its
//! control socket (`contract::disk::control`); the device swaps its backing file and tells the
//! guest's driver the capacity changed; then the guest's agent is asked to build the container
//! from that disk (`add_container` with `disk`), as it builds the ones named at boot.
//!
//! A removed container's disk serves the next: once the guest says nothing holds it any more
//! (`release_disk`: the container's mounts went with its last process), it goes back to the
//! free slots, and the guest drops its cached blocks before it mounts the next image.

use std::collections::BTreeMap;
use std::io::{self, BufRead, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use api_types::Hypervisor;

/// How long a device may take to answer: it swaps a descriptor and writes one line.
const DEVICE_ANSWER_WAIT: Duration = Duration::from_secs(10);

/// How long the guest's agent may take to build the container: waiting for the disk (5 s)
/// and for the container's agent to listen (10 s), and a margin.
const AGENT_ANSWER_WAIT: Duration = Duration::from_secs(20);

/// A microVM's empty disks for added containers, each by the container index its serial
/// carries (`crucible-ctr-N`, and so the vsock port its container's agent serves on), with
/// the container using it, if any.
#[derive(Debug, Default)]
pub(crate) struct SlotTable {
    holders: BTreeMap<usize, Option<usize>>,
}

impl SlotTable {
    /// The slots `slots`, all free.
    pub(crate) fn new(slots: std::ops::Range<usize>) -> SlotTable {
        Self::of(&slots.collect::<Vec<_>>())
    }

    /// The slots `slots` (a live-restore record's), all free.
    pub(crate) fn of(slots: &[usize]) -> SlotTable {
        SlotTable {
            holders: slots.iter().map(|&slot| (slot, None)).collect(),
        }
    }

    /// How many are free, and how many there are.
    pub(crate) fn room(&self) -> (usize, usize) {
        let free = self.holders.values().filter(|h| h.is_none()).count();
        (free, self.holders.len())
    }

    /// Gives the first free slot to container `index`.
    pub(crate) fn take(&mut self, index: usize) -> Option<usize> {
        let (&slot, holder) = self.holders.iter_mut().find(|(_, h)| h.is_none())?;
        *holder = Some(index);
        Some(slot)
    }

    /// The slot container `index` uses.
    pub(crate) fn slot_of(&self, index: usize) -> Option<usize> {
        self.holders
            .iter()
            .find(|(_, h)| **h == Some(index))
            .map(|(&slot, _)| slot)
    }

    /// Frees `slot`.
    pub(crate) fn free(&mut self, slot: usize) {
        if let Some(holder) = self.holders.get_mut(&slot) {
            *holder = None;
        }
    }
}

/// The control socket of the device holding the slot `serial`: `crucible-vmm` has one for all
/// its disks, each vhost-user block process (QEMU) one of its own.
pub(crate) fn control_socket(dir: &Path, hypervisor: Hypervisor, serial: &str) -> PathBuf {
    match hypervisor {
        Hypervisor::CrucibleVmm => dir.join("disk-control.sock"),
        Hypervisor::QemuTcg => dir.join(format!("{serial}-control.sock")),
    }
}

/// Gives the empty disk `serial` the image `disk` through the device's `control` socket;
/// blocking. Returns the disk's new capacity in sectors.
pub(crate) fn give_image(control: &Path, serial: &str, disk: &Path) -> Result<u64, String> {
    let image = std::fs::File::open(disk)
        .map_err(|e| format!("opening the image {}: {e}", disk.display()))?;
    let talk = || -> io::Result<String> {
        let mut device = UnixStream::connect(control)?;
        device.set_read_timeout(Some(DEVICE_ANSWER_WAIT))?;
        device.set_write_timeout(Some(DEVICE_ANSWER_WAIT))?;
        device.write_all(contract::disk::control::request(serial).as_bytes())?;
        ::namespace::send_stream(device.as_fd(), &OwnedFd::from(image))?;
        let mut answer = String::new();
        io::BufReader::new(&device).read_line(&mut answer)?;
        Ok(answer)
    };
    let answer = talk().map_err(|e| {
        format!(
            "giving disk {serial} its image through {}: {e}",
            control.display()
        )
    })?;
    contract::disk::control::parse_answer(&answer)
        .map_err(|why| format!("the device of disk {serial} refused its image: {why}"))
}

/// Asks the guest's agent, on `stream`, to build container `root.name` from the disk of
/// `slot`, `sectors` long with its image, and serve it on the port of `slot`; its security
/// settings (a seccomp profile at most, which the engine checked) go with it.
pub(crate) async fn ask_to_add(
    stream: tokio::net::UnixStream,
    slot: usize,
    root: &::namespace::ContainerRoot,
    sectors: u64,
    shared: &[wire::agent::SharedDir],
) -> Result<(), String> {
    let request = wire::agent::AgentRequest::AddContainer {
        command_is_pid1: false,
        name: root.name.clone(),
        index: slot,
        shared: shared.to_vec(),
        share_pids: root.share_pids,
        disk: Some(wire::agent::ContainerDisk {
            serial: contract::disk::container_serial(slot),
            sectors,
        }),
        security: match root.security.is_default() {
            true => String::new(),
            false => root.security.to_string(),
        },
        host_paths: Vec::new(),
    };
    match ask(stream, &request).await? {
        wire::agent::AgentReply::ContainerAdded { .. } => Ok(()),
        other => Err(format!("the guest's agent answered {other:?}")),
    }
}

/// Asks the guest's agent, on `stream`, whether nothing holds the disk of `slot` any more
/// (waiting up to its own deadline).
pub(crate) async fn ask_to_release(
    stream: tokio::net::UnixStream,
    slot: usize,
) -> Result<(), String> {
    let request = wire::agent::AgentRequest::ReleaseDisk {
        disk: contract::disk::container_serial(slot),
    };
    match ask(stream, &request).await? {
        wire::agent::AgentReply::DiskReleased => Ok(()),
        other => Err(format!("the guest's agent answered {other:?}")),
    }
}

/// One request to the guest's agent and its answer; an `error` answer is its message.
async fn ask(
    mut stream: tokio::net::UnixStream,
    request: &wire::agent::AgentRequest,
) -> Result<wire::agent::AgentReply, String> {
    let exchange = async {
        wire::write_message_async(&mut stream, request)
            .await
            .map_err(|e| report::chain(&e))?;
        wire::read_message_async::<_, wire::agent::AgentReply>(&mut stream)
            .await
            .map_err(|e| report::chain(&e))
    };
    let reply = tokio::time::timeout(AGENT_ANSWER_WAIT, exchange)
        .await
        .map_err(|_| {
            format!(
                "the guest's agent did not answer within {} s",
                AGENT_ANSWER_WAIT.as_secs()
            )
        })?
        .map_err(|e| format!("asking the guest's agent: {e}"))?;
    match reply {
        wire::agent::AgentReply::Error(body) => Err(body.message),
        reply => Ok(reply),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_in_order_found_by_holder_and_freed_for_the_next() {
        let mut table = SlotTable::new(2..4);
        assert_eq!(table.room(), (2, 2));
        assert_eq!(table.take(2), Some(2));
        assert_eq!(table.take(3), Some(3));
        assert_eq!(table.take(4), None);
        assert_eq!(table.room(), (0, 2));
        assert_eq!((table.slot_of(3), table.slot_of(9)), (Some(3), None));
        table.free(2);
        assert_eq!(
            table.take(5),
            Some(2),
            "a freed slot serves the next container"
        );
        assert_eq!(table.slot_of(5), Some(2));
        assert_eq!(SlotTable::new(0..0).room(), (0, 0));
    }

    #[test]
    fn each_vhost_user_disk_has_its_own_control_socket_and_our_vmm_one_for_all() {
        let dir = Path::new("/run/sb");
        assert_eq!(
            control_socket(dir, Hypervisor::CrucibleVmm, "crucible-ctr-1"),
            control_socket(dir, Hypervisor::CrucibleVmm, "crucible-ctr-2")
        );
        assert_eq!(
            control_socket(dir, Hypervisor::QemuTcg, "crucible-ctr-1"),
            Path::new("/run/sb/crucible-ctr-1-control.sock")
        );
    }

    #[test]
    fn an_image_goes_to_the_device_as_a_descriptor_and_its_answer_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let control = dir.path().join("control.sock");
        let listener = std::os::unix::net::UnixListener::bind(&control).expect("bind");
        let image = dir.path().join("image.ext4");
        std::fs::write(&image, vec![7u8; 4096]).expect("image");
        let device = std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            let mut line = Vec::new();
            let mut byte = [0u8];
            while byte != [b'\n'] {
                io::Read::read_exact(&mut &stream, &mut byte).expect("request");
                line.push(byte[0]);
            }
            assert_eq!(line, b"replace crucible-ctr-1\n");
            let received = ::namespace::recv_stream(stream.as_fd())
                .expect("recv")
                .expect("a descriptor");
            let len = std::fs::File::from(received)
                .metadata()
                .expect("stat")
                .len();
            (&stream)
                .write_all(contract::disk::control::answer(&Ok(len / 512)).as_bytes())
                .expect("answer");
        });
        assert_eq!(give_image(&control, "crucible-ctr-1", &image), Ok(8));
        device.join().expect("device");
        let err = give_image(&control, "crucible-ctr-1", &dir.path().join("missing"))
            .expect_err("no image");
        assert!(err.contains("missing"), "{err}");
    }
}
