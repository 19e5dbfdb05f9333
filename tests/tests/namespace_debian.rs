//! A Debian image on the namespace backend: the tree `cargo xtask build-image --rootfs debian
//! --packages gcc,make` debootstraps, imported as a directory (tarred on the fly, as `crucible
//! image import debian DIR` does), compiles and runs a C program in a namespace sandbox.

use std::path::PathBuf;

use api_types::CreateSandbox;
use harness::{sh, TestDaemon};

/// The debootstrapped tree the CI's Debian image build recorded in its manifest
/// (`$CRUCIBLE_DEBIAN_IMAGE`, else `target/crucible/debian`). Fails, saying how to build it,
/// when it is missing.
fn debian_tree() -> PathBuf {
    let dir = std::env::var_os("CRUCIBLE_DEBIAN_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/crucible/debian")
        });
    let manifest = dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the Debian image first: cargo xtask build-image --no-kernel \
             --rootfs debian --packages gcc,make --out target/crucible/debian (cargo xtask ci \
             does)",
            manifest.display()
        )
    });
    let json: serde_json::Value = serde_json::from_str(&text).expect("manifest JSON");
    let tree = PathBuf::from(
        json["rootfs_info"]["tree"]
            .as_str()
            .expect("the manifest names the debootstrapped tree"),
    );
    assert!(
        tree.join("usr/bin/gcc").exists(),
        "no gcc in {}",
        tree.display()
    );
    tree
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debian_image_compiles_and_runs_c_in_a_namespace_sandbox() {
    let tree = debian_tree();
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let (writer, reader) = tokio::io::duplex(256 * 1024);
    let tarring = tokio::task::spawn_blocking(move || {
        let mut bridge = tokio_util::io::SyncIoBridge::new(writer);
        let mut builder = tar::Builder::new(&mut bridge);
        let skipped = oci::write::append_tree(&mut builder, &tree).expect("tar the tree");
        builder.finish().expect("finish");
        drop(builder);
        let _ = bridge.shutdown();
        skipped
    });
    let info = c.import_image("debian", reader).await.expect("import");
    tarring.await.expect("tarring");
    assert_eq!(info.format, "rootfs");
    assert!(info.entries > 5_000, "{info:?}");

    let id = c
        .create(&CreateSandbox {
            image: Some("debian".into()),
            ..CreateSandbox::default()
        })
        .await
        .expect("create")
        .id;
    let (out, err, code) = sh(
        &c,
        &id,
        r#"set -e; cd /tmp
cat > hello.c <<'C_SOURCE'
#include <stdio.h>
int main(void) { printf("hello from %s\n", "C"); return 7; }
C_SOURCE
printf 'hello: hello.c\n\tcc -O2 -o hello hello.c\n' > Makefile
make -s
./hello || echo "exit $?"
. /etc/os-release; echo $ID"#,
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out, "hello from C\nexit 7\ndebian\n", "{err}");
}
