//! A microVM's disks beside its root: the disk-backed writable layer, the caches and the
//! volumes (their read-only snapshots), each an ext4 image on a virtio-blk device, and the kernel command-line words that tell the guest
//! which is which. The guest finds each by its serial ([`contract::disk`]); our block device
//! reports the file name of the path it opens as its serial, so each image is handed over
//! through a link named after its serial in the sandbox's runtime directory. The same plan
//! serves both hypervisors: `crucible-vmm`'s `block` list and one `crucible-vmm vhost-user
//! block` process per disk under QEMU.

use std::path::{Path, PathBuf};

use contract::cmdline::{BootConfig, DiskMount, VmContainer};
use contract::disk::{container_serial, mount_serial, SCRATCH_SERIAL};

use super::{MountSource, MountSpec};

/// The most disks a microVM gets beside its root: QEMU's `microvm` machine has eight
/// virtio-mmio transports, one taken by vsock and one by the image's root disk.
pub(crate) const MAX_DISKS: usize = 6;

/// One disk to attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlannedDisk {
    /// Its serial, which is also the name of its link.
    pub(crate) serial: String,
    /// The image on the host.
    pub(crate) image: PathBuf,
    /// Attached read-only.
    pub(crate) read_only: bool,
    /// An empty slot for a container added later: an empty file, given its image while the
    /// guest runs (`contract::disk::control`); `image` is unused.
    pub(crate) spare: bool,
}

/// Every disk of one sandbox, in attach order, and what the guest is told about them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DiskPlan {
    /// The disks: the writable layer first, then the mounts in request order.
    pub(crate) disks: Vec<PlannedDisk>,
    /// `crucible.scratch=`.
    pub(crate) scratch: Option<String>,
    /// `crucible.mount=`.
    pub(crate) mounts: Vec<DiskMount>,
    /// `crucible.container=`.
    pub(crate) containers: Vec<VmContainer>,
    /// The container indices of the empty slots (their serials are `container_serial` of
    /// each): the guest is told of them only when one is filled.
    pub(crate) slots: std::ops::Range<usize>,
}

/// Why a sandbox's storage cannot be given to a microVM.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DiskPlanError {
    /// A host directory: a VM can only be given block devices (a volume reaches it as its
    /// snapshot image, which the daemon substitutes before planning).
    #[error("a host directory cannot be attached to a microVM, only an image")]
    Directory,
    /// More disks than the machine has transports for.
    #[error(
        "a microVM takes at most {MAX_DISKS} disks beside its root (caches, volumes, \
         disk_mib, each container's image and container_slots together); {0} asked for"
    )]
    TooMany(usize),
}

impl DiskPlan {
    /// The plan for a writable layer on `scratch` (if any), `mounts`, `containers` (each
    /// one's name and its image's ext4, attached read-only) and `slots` empty read-only disks
    /// for containers added later, in that order.
    pub(crate) fn new(
        scratch: Option<&Path>,
        mounts: &[MountSpec],
        containers: &[(String, PathBuf)],
        slots: usize,
    ) -> Result<DiskPlan, DiskPlanError> {
        let count = usize::from(scratch.is_some()) + mounts.len() + containers.len() + slots;
        if count > MAX_DISKS {
            return Err(DiskPlanError::TooMany(count));
        }
        let mut plan = DiskPlan::default();
        if let Some(image) = scratch {
            plan.disks.push(PlannedDisk {
                serial: SCRATCH_SERIAL.into(),
                image: image.to_owned(),
                read_only: false,
                spare: false,
            });
            plan.scratch = Some(SCRATCH_SERIAL.into());
        }
        for (index, mount) in mounts.iter().enumerate() {
            let MountSource::Ext4Image(image) = &mount.source else {
                return Err(DiskPlanError::Directory);
            };
            let serial = mount_serial(index);
            plan.disks.push(PlannedDisk {
                serial: serial.clone(),
                image: image.clone(),
                read_only: mount.read_only,
                spare: false,
            });
            plan.mounts.push(DiskMount {
                serial,
                target: mount.target.clone(),
                read_only: mount.read_only,
            });
        }
        for (index, (name, image)) in containers.iter().enumerate() {
            let serial = container_serial(index);
            plan.disks.push(PlannedDisk {
                serial: serial.clone(),
                image: image.clone(),
                read_only: true,
                spare: false,
            });
            plan.containers.push(VmContainer {
                name: name.clone(),
                serial,
                share_pids: false,
            });
        }
        plan.slots = containers.len()..containers.len() + slots;
        for index in plan.slots.clone() {
            plan.disks.push(PlannedDisk {
                serial: container_serial(index),
                image: PathBuf::new(),
                read_only: true,
                spare: true,
            });
        }
        Ok(plan)
    }

    /// Whether a disk the guest writes outlives the sandbox (a cache): the guest must then be
    /// asked to flush it before it is killed.
    pub(crate) fn outlives_the_sandbox(&self) -> bool {
        self.mounts.iter().any(|m| !m.read_only)
    }

    /// Adds what the guest must know to `boot`.
    pub(crate) fn describe_to(&self, boot: &mut BootConfig) {
        boot.scratch = self.scratch.clone();
        boot.mounts = self.mounts.clone();
        boot.containers = self.containers.clone();
    }

    /// Makes each disk's link in `dir` (replacing a stale one; an empty file for a slot) and
    /// returns the paths to hand the block devices, in order.
    pub(crate) fn link_in(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        self.disks
            .iter()
            .map(|disk| {
                let link = dir.join(&disk.serial);
                match std::fs::remove_file(&link) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                match disk.spare {
                    true => drop(std::fs::File::create(&link)?),
                    false => std::os::unix::fs::symlink(&disk.image, &link)?,
                }
                Ok(link)
            })
            .collect()
    }
}

/// Whether a request for a disk-backed layer (`disk`), caches and volumes at `targets`,
/// `containers` (their names) and `shared` mounts fits a microVM: the number of disks, and
/// the command line that names them (with `hostname` as long as the sandbox's id will be,
/// egress on), checked before anything is claimed.
pub(crate) fn check_request(
    hostname: &str,
    disk: bool,
    targets: &[&str],
    containers: &[&str],
    slots: usize,
    shared: &[contract::cmdline::VmShared],
) -> Result<(), String> {
    let mounts: Vec<MountSpec> = targets
        .iter()
        .map(|target| MountSpec {
            source: MountSource::Ext4Image(PathBuf::from("/cache.ext4")),
            target: (*target).to_string(),
            read_only: false,
        })
        .collect();
    let scratch = disk.then(|| Path::new("/scratch.ext4"));
    let containers: Vec<(String, PathBuf)> = containers
        .iter()
        .map(|name| (name.to_string(), PathBuf::from("/image.ext4")))
        .collect();
    let plan = DiskPlan::new(scratch, &mounts, &containers, slots).map_err(|e| e.to_string())?;
    let mut boot = BootConfig {
        shared: shared.to_vec(),
        boot_marker: true,
        hostname: hostname.to_string(),
        egress_port: Some(contract::egress::VSOCK_PORT),
        ..BootConfig::default()
    };
    plan.describe_to(&mut boot);
    boot.to_cmdline().map(drop).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "sb-0123456789abcdef";

    fn cache(image: &str, target: &str) -> MountSpec {
        MountSpec {
            source: MountSource::Ext4Image(image.into()),
            target: target.into(),
            read_only: false,
        }
    }

    #[test]
    fn the_layer_comes_first_then_the_mounts_each_under_its_own_serial() {
        let plan = DiskPlan::new(
            Some(Path::new("/data/scratch/sb-1.ext4")),
            &[
                cache("/data/caches/u/cargo.ext4", "/root/.cargo/registry"),
                MountSpec {
                    read_only: true,
                    ..cache("/data/caches/u/npm.ext4", "/root/.npm")
                },
            ],
            &[("db".into(), "/store/disks/pg.ext4".into())],
            0,
        )
        .expect("plan");
        let serials: Vec<&str> = plan.disks.iter().map(|d| d.serial.as_str()).collect();
        assert_eq!(
            serials,
            [
                "crucible-scratch",
                "crucible-mount-0",
                "crucible-mount-1",
                "crucible-ctr-0"
            ]
        );
        assert_eq!(plan.disks[1].image, Path::new("/data/caches/u/cargo.ext4"));
        assert!(plan.disks[2].read_only && !plan.disks[0].read_only);
        assert!(
            plan.disks[3].read_only,
            "a container's image is never written"
        );
        let mut boot = BootConfig::default();
        plan.describe_to(&mut boot);
        let line = boot.to_cmdline().expect("cmdline");
        assert_eq!(
            line,
            "crucible.scratch=crucible-scratch \
             crucible.mount=crucible-mount-0:rw:/root/.cargo/registry \
             crucible.mount=crucible-mount-1:ro:/root/.npm \
             crucible.container=db:crucible-ctr-0"
        );
        // What the guest reads back.
        let parsed = BootConfig::parse(&line);
        assert_eq!(parsed.scratch.as_deref(), Some("crucible-scratch"));
        assert_eq!(parsed.mounts, plan.mounts);
        assert_eq!(parsed.containers, plan.containers);
    }

    #[test]
    fn nothing_asked_is_no_disk_and_no_word() {
        let plan = DiskPlan::new(None, &[], &[], 0).expect("plan");
        assert!(plan.disks.is_empty());
        let mut boot = BootConfig::default();
        plan.describe_to(&mut boot);
        assert_eq!(boot.to_cmdline().expect("cmdline"), "");
    }

    #[test]
    fn host_directories_and_too_many_disks_are_refused() {
        let volume = MountSpec {
            source: MountSource::Directory("/srv/tools".into()),
            target: "/opt/tools".into(),
            read_only: true,
        };
        assert_eq!(
            DiskPlan::new(None, &[volume], &[], 0),
            Err(DiskPlanError::Directory)
        );
        let six: Vec<MountSpec> = (0..6)
            .map(|i| cache("/c.ext4", &format!("/c{i}")))
            .collect();
        assert!(DiskPlan::new(None, &six, &[], 0).is_ok());
        assert_eq!(
            DiskPlan::new(Some(Path::new("/s.ext4")), &six, &[], 0),
            Err(DiskPlanError::TooMany(7))
        );
        let err = check_request(ID, true, &["/a", "/b", "/c", "/d", "/e", "/f"], &[], 0, &[])
            .expect_err("7");
        assert!(err.contains("at most 6"), "{err}");
        let err = check_request(
            ID,
            true,
            &["/a", "/b", "/c"],
            &["db", "web", "cache"],
            0,
            &[],
        )
        .expect_err("7 with the containers' images");
        assert!(err.contains("each container's image"), "{err}");
    }

    #[test]
    fn a_request_whose_paths_would_not_fit_the_command_line_is_refused_before_anything_is_made() {
        check_request(
            ID,
            true,
            &["/root/.cargo/registry", "/with space/é"],
            &[],
            0,
            &[],
        )
        .expect("fits");
        let long = format!("/{}", "d".repeat(300));
        let err = check_request(
            ID,
            false,
            &[&long, &format!("{long}2"), &format!("{long}3")],
            &[],
            0,
            &[],
        )
        .expect_err("too long");
        assert!(err.contains("kernel command line"), "{err}");
    }

    #[test]
    fn links_are_named_by_serial_and_point_at_the_images() {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("cargo.ext4");
        std::fs::write(&image, b"ext4").expect("image");
        let plan =
            DiskPlan::new(None, &[cache(&image.to_string_lossy(), "/c")], &[], 0).expect("plan");
        // A stale link from an earlier attempt is replaced.
        std::os::unix::fs::symlink("/nowhere", dir.path().join("crucible-mount-0")).expect("ln");
        let links = plan.link_in(dir.path()).expect("links");
        assert_eq!(links, [dir.path().join("crucible-mount-0")]);
        assert_eq!(std::fs::read(&links[0]).expect("through the link"), b"ext4");
    }

    #[test]
    fn slots_follow_the_containers_as_empty_read_only_disks_the_guest_is_not_told_of() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan =
            DiskPlan::new(None, &[], &[("db".into(), "/store/pg.ext4".into())], 2).expect("plan");
        assert_eq!(plan.slots, 1..3);
        let serials: Vec<&str> = plan.disks.iter().map(|d| d.serial.as_str()).collect();
        assert_eq!(
            serials,
            ["crucible-ctr-0", "crucible-ctr-1", "crucible-ctr-2"]
        );
        assert!(plan.disks.iter().all(|d| d.read_only));
        let mut boot = BootConfig::default();
        plan.describe_to(&mut boot);
        assert_eq!(
            boot.to_cmdline().expect("cmdline"),
            "crucible.container=db:crucible-ctr-0"
        );
        // A stale file of an earlier attempt is replaced by an empty one.
        std::fs::write(dir.path().join("crucible-ctr-2"), b"stale").expect("stale");
        let links = plan.link_in(dir.path()).expect("links");
        for slot in &links[1..] {
            let meta = std::fs::symlink_metadata(slot).expect("slot");
            assert!(meta.is_file() && meta.len() == 0, "{}", slot.display());
        }
        let err = check_request(ID, true, &["/a", "/b", "/c"], &["db"], 2, &[])
            .expect_err("7 with the slots");
        assert!(err.contains("container_slots"), "{err}");
    }
}
