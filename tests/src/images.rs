//! Image archives built locally for the tests (no registry is reachable from CI): the busybox
//! root tree of the built image as a base layer, and a second layer that deletes a file
//! (whiteout), replaces a directory (opaque) and adds a user.

use std::path::Path;

use oci::compression::Compression;
use oci::manifest::RunConfig;
use oci::write::{self, ImageParts, LayerBuilder};

/// The file the top layer deletes.
pub const DELETED: &str = "/etc/deleted-by-layer-2";
/// The directory the top layer replaces: the base has `old`, the top `new`.
pub const REPLACED: &str = "/opt/app";

/// The base layer: the built image's busybox tree, plus what the top layer changes and an
/// `/init` that is not our agent (the agent is never taken from an image).
pub fn base_layer() -> Vec<u8> {
    let rootfs = crate::image_dir().join("rootfs");
    let mut builder = tar::Builder::new(Vec::new());
    write::append_tree(&mut builder, &rootfs).expect("tar the busybox tree");
    let mut layer = builder.into_inner().expect("finish");
    // Drop the tar's end-of-archive blocks, then add members with a second builder.
    strip_end(&mut layer);
    let extra = LayerBuilder::new()
        .file(&DELETED[1..], 0o644, b"from layer 1\n")
        .and_then(|l| l.dir(&REPLACED[1..], 0o755))
        .and_then(|l| l.file(&format!("{}/old", &REPLACED[1..]), 0o644, b"old\n"))
        .and_then(|l| l.file("init", 0o755, b"#!/bin/sh\necho not-our-agent > /pwned\n"))
        .and_then(|l| l.finish())
        .expect("extra members");
    layer.extend_from_slice(&extra);
    layer
}

/// Removes the trailing zero blocks of a tar archive, so members can be appended.
fn strip_end(tar: &mut Vec<u8>) {
    while tar.len() >= 512 && tar[tar.len() - 512..].iter().all(|&b| b == 0) {
        tar.truncate(tar.len() - 512);
    }
}

/// The top layer: whiteout, opaque directory, a `ci` user with a home.
pub fn top_layer() -> Vec<u8> {
    let passwd = "root:x:0:0:root:/root:/bin/sh\nci:x:1000:1000:ci:/home/ci:/bin/sh\n";
    let group = "root:x:0:\nci:x:1000:\nbuilders:x:2000:ci\n";
    LayerBuilder::new()
        .file(&format!("{}/new", &REPLACED[1..]), 0o644, b"new\n")
        .and_then(|l| l.opaque(&REPLACED[1..]))
        .and_then(|l| l.whiteout(&DELETED[1..]))
        .and_then(|l| l.file("etc/passwd", 0o644, passwd.as_bytes()))
        .and_then(|l| l.file("etc/group", 0o644, group.as_bytes()))
        .and_then(|l| l.dir("home/ci", 0o755))
        .and_then(|l| l.finish())
        .expect("top layer")
}

/// The two-layer image with its config: `Env` (`GREETING`, `PATH`), `WorkingDir` `/opt/app`,
/// `User` `ci`.
pub fn two_layer_image(gzip: bool) -> ImageParts {
    ImageParts {
        layers: vec![base_layer(), top_layer()],
        config: RunConfig {
            env: Some(vec![
                "PATH=/usr/sbin:/usr/bin:/sbin:/bin".into(),
                "GREETING=hello from the image".into(),
            ]),
            working_dir: Some(REPLACED.into()),
            user: Some("ci".into()),
            ..RunConfig::default()
        },
        reference: Some("example.test/ci:1".into()),
        compression: if gzip {
            Compression::Gzip
        } else {
            Compression::None
        },
    }
}

/// Streams the file at `path` to the daemon as image `name`.
pub async fn import_file(
    client: &client::Client,
    name: &str,
    path: &Path,
) -> Result<api_types::ImageInfo, client::ClientError> {
    let file = tokio::fs::File::open(path).await.expect("open the archive");
    client.import_image(name, file).await
}

/// Imports [`two_layer_image`] (an OCI archive with gzip layers, written to a temporary file)
/// as `name` through `client`.
pub async fn import_two_layer(
    client: &client::Client,
    name: &str,
) -> Result<api_types::ImageInfo, client::ClientError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let archive = dir.path().join("image.tar");
    write::oci_archive(&archive, &two_layer_image(true)).expect("write the OCI archive");
    import_file(client, name, &archive).await
}

/// What [`TWO_LAYER_PROBE`] prints in a sandbox of [`two_layer_image`]: the working directory,
/// the user's ids and groups, the image's env and `HOME`, the opaque directory's contents, the
/// whiteout applied, our agent (`init`) as PID 1 and no sign of the image's own `/init`.
pub const TWO_LAYER_EXPECTED: [&str; 7] = [
    REPLACED,
    "1000",
    "1000 2000",
    "hello from the image|/home/ci",
    "new",
    "deleted",
    "init",
];

/// The shell script whose output is [`TWO_LAYER_EXPECTED`].
pub const TWO_LAYER_PROBE: &str = "pwd; id -u; id -G; echo \"$GREETING|$HOME\"; ls /opt/app; \
     test -e /etc/deleted-by-layer-2 && echo present || echo deleted; \
     test -e /pwned && echo pwned; cat /proc/1/comm";
