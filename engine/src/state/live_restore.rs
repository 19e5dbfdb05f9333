//! Live restore: a new daemon takes back the sandboxes an earlier one left running, each
//! checked against its record and by its backend, and says why it does not take back the
//! others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::egress::EgressCounters;
use crate::owner::Owner;
use crate::restore::RestoreError;
use crate::sandbox::{Sandbox, SandboxNetwork, SandboxSettings};
use crate::storage::{SandboxStorage, DEFAULT_IMAGE};

use super::{mount_target, CreateError, Engine};

/// How many sandboxes live restore checks at once.
const RESTORE_CONCURRENCY: usize = 16;

impl Engine {
    /// Live restore at startup: takes back every sandbox a record describes and its backend
    /// verifies, and says (in the log) why it does not take back each of the others. Returns
    /// the ids taken back; the caller cleans up everything else an earlier daemon left.
    /// Sandboxes are checked [`RESTORE_CONCURRENCY`] at a time: a silent agent costs its ping's
    /// deadline, not the whole restore's. `keys` names the API keys this daemon has: a sandbox
    /// of a key no longer among them (revoked) is not taken back but deleted, so that it is
    /// never anyone's.
    pub async fn restore(&self, keys: &[String]) -> Vec<String> {
        use futures_util::StreamExt;
        let state_dir = &self.config.state_dir;
        let outcomes: Vec<(String, Result<(), RestoreError>, Duration)> =
            futures_util::stream::iter(crate::restore::read_all(state_dir))
                .map(|(id, record)| async move {
                    let started = Instant::now();
                    let outcome = match record {
                        Ok(record) => match revoked_owner(&record.owner, keys) {
                            Some(why) => Err(RestoreError::Unsupported(why)),
                            None => self.adopt(record).await,
                        },
                        Err(e) => Err(e),
                    };
                    (id, outcome, started.elapsed())
                })
                .buffer_unordered(RESTORE_CONCURRENCY)
                .collect()
                .await;
        let mut adopted = Vec::new();
        for (id, outcome, took) in outcomes {
            match outcome {
                Ok(()) => {
                    tracing::info!("live restore: took back sandbox {id} in {took:.1?}");
                    adopted.push(id);
                }
                Err(e) => {
                    tracing::warn!(
                        "live restore: not taking back sandbox {id}: {}; cleaning it up",
                        report::chain(&e)
                    );
                    crate::restore::remove(state_dir, &id);
                }
            }
        }
        adopted.sort();
        if let Ok(storage) = self.storage() {
            storage.finish_restore(&adopted);
        }
        adopted
    }

    /// Takes back the sandbox `record` describes, or says why not.
    async fn adopt(&self, record: crate::restore::SandboxRecord) -> Result<(), RestoreError> {
        record
            .instance
            .hello
            .check_protocol()
            .map_err(RestoreError::Unsupported)?;
        let refused = |e: CreateError| RestoreError::Unsupported(report::chain(&e));
        let backend = self.backend(record.backend).map_err(refused)?;
        let reservation = self
            .registry
            .reserve(self.config.limits.max_sandboxes)
            .map_err(|e| RestoreError::Unsupported(report::chain(&e)))?;
        let owner: Owner = record.owner.clone().into();
        // Before any process is touched: what is refused here is the stale cleanup's.
        let imported = self.relet_image(&record, &owner)?;
        let accounts = self
            .accounts(imported.as_ref().map(|(r, _)| r))
            .map_err(refused)?;
        let network = match record.network.is_empty() {
            true => None,
            false => {
                // Its rules must still be within the operator's: a restart may narrow them.
                let plan = self.egress.plan(&record.network).map_err(|e| {
                    RestoreError::Unsupported(format!(
                        "its network.allow {:?}: {e}",
                        record.network
                    ))
                })?;
                let counters = Arc::new(EgressCounters::for_sandbox(self.metrics.egress.clone()));
                let sink = plan(&record.id, counters.clone());
                Some((counters, sink))
            }
        };
        let spec = crate::backend::AdoptSpec {
            egress: network.as_ref().map(|(_, sink)| sink.clone()),
            shut_down_first: !record.caches.is_empty(),
        };
        let instance = backend.adopt(&record.id, &record.instance, spec).await?;
        // From here the instance is the recorded sandbox: a refusal destroys it.
        let held = match self.reclaim_storage(&record, &owner, &*instance).await {
            Ok(mut held) => {
                held.image = imported.map(|(_, lease)| lease);
                held
            }
            Err(e) => {
                instance.destroy().await;
                return Err(e);
            }
        };
        let settings = SandboxSettings {
            backend: record.backend,
            image: record.image,
            image_root: record.image_root,
            memory_mib: record.memory_mib,
            vcpus: record.vcpus,
            ttl: Duration::from_secs(record.ttl_s),
            idle: Duration::from_secs(record.idle_s),
            labels: record.labels,
            env: record.env,
            max_execs: record.max_execs,
            exec_tail_bytes: record.exec_tail_bytes,
            owner,
            caches: record.caches,
            volumes: record.volumes,
            disk_mib: record.disk_mib,
            share_process_namespace: record.share_process_namespace,
            hostname: record.hostname,
            network: network.map(|(counters, _)| SandboxNetwork {
                allow: record.network,
                in_pod: false,
                counters,
            }),
            image_defaults: record.defaults.map(Arc::new),
            accounts,
        };
        let sandbox = Arc::new(Sandbox::restored(
            record.id,
            settings,
            instance,
            record.created_at_ms,
            record.create_to_ready_ms,
            held,
        ));
        self.registry.insert(sandbox, reservation);
        Ok(())
    }

    /// Holds the imported image a sandbox taken back runs, which must still be the very tree
    /// it was made from; `None` for the built-in image.
    fn relet_image(
        &self,
        record: &crate::restore::SandboxRecord,
        owner: &Owner,
    ) -> Result<Option<(oci::ImageRecord, oci::ImageLease)>, RestoreError> {
        if record.image == DEFAULT_IMAGE {
            return Ok(None);
        }
        let why = |e: &dyn std::error::Error| {
            RestoreError::Mismatch(format!(
                "its image {:?}: {}",
                record.image,
                report::chain(e)
            ))
        };
        let leased = self
            .lease_image(&record.image, owner)
            .map_err(|e| why(&e))?;
        let Some((image, lease)) = leased else {
            return Ok(None);
        };
        let root = image.root.hex();
        if record.image_root.as_deref() != Some(root) {
            return Err(RestoreError::Mismatch(format!(
                "its image {:?} is another image now (tree {root}, recorded {:?})",
                record.image, record.image_root
            )));
        }
        Ok(Some((image, lease)))
    }

    /// Takes back what a sandbox holds of the storage, each part checked from the host to be
    /// held by that very sandbox (`instance`): its caches (free here, mounted where recorded),
    /// its volumes (a microVM's snapshots, a namespace sandbox's binds), its disk-backed
    /// layer, and a microVM's imported root disk.
    async fn reclaim_storage(
        &self,
        record: &crate::restore::SandboxRecord,
        owner: &Owner,
        instance: &dyn crate::backend::Instance,
    ) -> Result<SandboxStorage, RestoreError> {
        use crate::backend::Held;
        let mut held = SandboxStorage::default();
        // Disks fixed at boot: each volume and an imported root are block devices.
        let disks = self.capabilities(record.backend).disks_fixed_at_boot;
        let needs_storage = !record.caches.is_empty()
            || !record.volumes.is_empty()
            || record.disk_mib.is_some()
            || (record.image != DEFAULT_IMAGE && disks);
        if !needs_storage {
            return Ok(held);
        }
        let storage = self
            .storage()
            .map_err(|e| RestoreError::Unsupported(report::chain(&e)))?;
        let check = |what: Held<'_>| {
            instance
                .check_holds(what)
                .map_err(|why| RestoreError::Mismatch(format!("{}: {why}", what.describe())))
        };
        for volume in &record.volumes {
            let mismatch = |why: String| {
                RestoreError::Mismatch(format!("its volume {:?}: {why}", volume.name))
            };
            let dir = storage
                .volumes
                .get(&volume.name)
                .map_err(|e| mismatch(report::chain(&e)))?;
            let target = mount_target(&volume.path);
            if disks {
                let image = storage
                    .volume_snapshots
                    .reclaim(&volume.name)
                    .await
                    .map_err(|e| mismatch(report::chain(&e)))?;
                check(Held::Mounted {
                    image: &image,
                    target: &target,
                })?;
            } else {
                check(Held::Bound {
                    dir,
                    target: &target,
                })?;
            }
        }
        for cache in &record.caches {
            let mismatch =
                |why: String| RestoreError::Mismatch(format!("its cache {:?}: {why}", cache.name));
            let lease = storage
                .caches
                .reclaim(owner, &cache.name, &record.id, record.backend, cache.save)
                .map_err(|e| mismatch(report::chain(&e)))?;
            instance
                .check_holds(Held::Mounted {
                    image: lease.path(),
                    target: &mount_target(&cache.path),
                })
                .map_err(mismatch)?;
            held.caches.push(lease);
        }
        if record.disk_mib.is_some() {
            let scratch = storage.scratch.reclaim(&record.id).map_err(|e| {
                RestoreError::Mismatch(format!("its writable layer: {}", report::chain(&e)))
            })?;
            check(Held::WritableLayer {
                image: scratch.path(),
            })?;
            held.scratch = Some(scratch);
        }
        if disks && record.image != DEFAULT_IMAGE {
            let image = storage
                .images
                .get(owner, &record.image)
                .map_err(|e| RestoreError::Mismatch(report::chain(&e)))?;
            let disk = storage
                .images
                .reclaim_root_disk(&image)
                .await
                .map_err(|e| {
                    RestoreError::Mismatch(format!("its root disk: {}", report::chain(&e)))
                })?;
            check(Held::RootImage { image: &disk })?;
        }
        Ok(held)
    }
}

/// Why a recorded sandbox's owner no longer owns anything on this daemon: its key is not
/// among `keys` (revoked). `None` for a configured key and for the Unix socket.
fn revoked_owner(owner: &crate::restore::RecordedOwner, keys: &[String]) -> Option<String> {
    match owner {
        crate::restore::RecordedOwner::Key(name) if !keys.iter().any(|k| k == name) => {
            Some(format!(
                "its owner, key {name:?}, is no longer configured: a revoked key's sandboxes \
                 are deleted, never handed to another key"
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore::RecordedOwner;

    #[test]
    fn a_sandbox_of_a_key_no_longer_configured_is_revoked_and_the_sockets_never_is() {
        let keys = ["ci".to_string(), "key-0123456789abcdef".to_string()];
        assert_eq!(revoked_owner(&RecordedOwner::Key("ci".into()), &keys), None);
        assert_eq!(revoked_owner(&RecordedOwner::Unix, &keys), None);
        assert_eq!(revoked_owner(&RecordedOwner::Unix, &[]), None);
        let why = revoked_owner(&RecordedOwner::Key("dev".into()), &keys).expect("revoked");
        assert!(
            why.contains("key \"dev\", is no longer configured"),
            "{why}"
        );
        assert!(revoked_owner(&RecordedOwner::Key("ci".into()), &[]).is_some());
    }
}
