//! `GET/POST /images`, `GET/DELETE /images/{name}`: importing an archive streamed as the
//! request body (spooled to the store's disk, then unpacked on a blocking thread), and the
//! API's view of an image.

use std::sync::Arc;

use api_types::{ImageInfo, ImageUser};
use axum::body::Body;
use axum::http::StatusCode;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::auth::Owner;
use crate::edge::Edge;
use crate::error::ApiError;
use engine::storage::Images;
use engine::storage::DEFAULT_IMAGE;

/// What the built-in image (the daemon's own busybox tree) shows as its owner: everyone's.
pub(crate) const BUILTIN_OWNER: &str = "*";

/// Removes a spooled upload if the request ends before the import takes it over.
struct Spool(std::path::PathBuf);

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `POST /images?name=NAME`: the body is the archive (an OCI layout or archive, a `docker save`
/// archive, or a rootfs tarball; gzip or not).
pub(crate) async fn import(
    state: Arc<Edge>,
    owner: Owner,
    name: String,
    body: Body,
) -> Result<ImageInfo, ApiError> {
    let mut body = body.into_data_stream();
    // Refused before the body was read whole, the rest is read and dropped after the answer
    // (`linger`), so the client gets it rather than a broken pipe mid-send.
    let (spool, lease, received) = spool(&state, &name, &mut body).await?;
    finish_import(&state, owner, &name, spool, lease, received).await
}

/// Writes the upload to the store's disk, growing its share of the disk budget as it comes.
async fn spool(
    state: &Edge,
    name: &str,
    body: &mut axum::body::BodyDataStream,
) -> Result<(Spool, engine::storage::BudgetLease, u64), ApiError> {
    let images = &state.storage()?.images;
    let (path, mut lease) = images.begin_import(name)?;
    let spool = Spool(path.clone());
    let limit = images.max_mib() * 1024 * 1024;
    let idle = state.http.header_timeout;
    let mut file = tokio::fs::File::create(&path)
        .await
        .map_err(|e| ApiError::internal(format!("create {}: {e}", path.display())))?;
    let mut received = 0u64;
    loop {
        let chunk = match tokio::time::timeout(idle, body.next()).await {
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!("the upload stalled: no data for {idle:?} after {received} bytes"),
                ))
            }
            Ok(None) => break,
            Ok(Some(chunk)) => chunk.map_err(|e| {
                ApiError::invalid(format!(
                    "reading the upload failed after {received} bytes: {e}"
                ))
            })?,
        };
        received += chunk.len() as u64;
        if received > limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "image_too_large",
                format!(
                    "the archive is over the {} MiB import limit (crucible serve \
                     --image-max-mib raises it)",
                    images.max_mib()
                ),
            ));
        }
        let needed_mib = received.div_ceil(1024 * 1024);
        if needed_mib > lease.mib() {
            lease.grow(
                &format!("the upload of image {name:?}"),
                needed_mib - lease.mib(),
            )?;
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| ApiError::internal(format!("write {}: {e}", path.display())))?;
    }
    if received == 0 {
        return Err(ApiError::invalid(
            "the request body is empty: send the image archive (docker save, an OCI layout \
             tarred, or a rootfs tarball)",
        ));
    }
    file.flush()
        .await
        .map_err(|e| ApiError::internal(format!("write {}: {e}", path.display())))?;
    drop(file);
    Ok((spool, lease, received))
}

/// Unpacks a spooled upload into the store.
async fn finish_import(
    state: &Edge,
    owner: Owner,
    name: &str,
    spool: Spool,
    lease: engine::storage::BudgetLease,
    received: u64,
) -> Result<ImageInfo, ApiError> {
    state
        .metrics
        .bytes_uploaded
        .fetch_add(received, std::sync::atomic::Ordering::Relaxed);
    let started = std::time::Instant::now();
    let images = &state.storage()?.images;
    let record = images.import(&owner, name, spool.0.clone(), lease).await?;
    drop(spool);
    tracing::info!(
        image = %name,
        owner = %owner,
        format = ?record.format,
        layers = record.layers.len(),
        bytes = record.summary.bytes,
        entries = record.summary.entries,
        dropped_devices = record.summary.dropped_devices,
        "imported image from a {received}-byte archive in {:?}",
        started.elapsed()
    );
    Ok(info(&record))
}

/// The API's view of an imported image.
pub(crate) fn info(record: &oci::ImageRecord) -> ImageInfo {
    ImageInfo {
        name: record.name.clone(),
        owner: Images::owner_of(record).map_or_else(|| record.owner.clone(), |o| o.to_string()),
        format: match record.format {
            oci::source::Format::Oci => "oci",
            oci::source::Format::DockerSave => "docker_save",
            oci::source::Format::Rootfs => "rootfs",
        }
        .to_string(),
        reference: record.reference.clone(),
        id: record.config_digest.as_ref().map(ToString::to_string),
        layers: record.layers.iter().map(|l| l.digest.to_string()).collect(),
        size_bytes: record.summary.bytes,
        entries: record.summary.entries,
        dropped_devices: record.summary.dropped_devices,
        env: record.defaults.env.clone(),
        working_dir: record.defaults.working_dir.clone(),
        user: record.defaults.user.as_ref().map(|u| ImageUser {
            spec: u.spec.clone(),
            uid: u.uid,
            gid: u.gid,
            groups: u.groups.clone(),
        }),
        entrypoint: record.run_config.entrypoint.clone(),
        cmd: record.run_config.cmd.clone(),
        imported_at: record.imported_at,
    }
}

/// The built-in image, as `GET /images` lists it first.
pub(crate) fn builtin() -> ImageInfo {
    ImageInfo {
        name: DEFAULT_IMAGE.to_string(),
        owner: BUILTIN_OWNER.to_string(),
        format: "builtin".to_string(),
        reference: None,
        id: None,
        layers: Vec::new(),
        size_bytes: 0,
        entries: 0,
        dropped_devices: 0,
        env: Default::default(),
        working_dir: None,
        user: None,
        entrypoint: None,
        cmd: None,
        imported_at: 0,
    }
}
