//! A realistic CI job inside a namespace sandbox, to prove the boundary (a user namespace, a
//! read-only idmapped image, namespaced capabilities, the seccomp allowlist) leaves root the
//! powers a job uses: install a file tree, edit `/etc`, add a user and build as that user with
//! `su`, `chown`, write to `/tmp`, `/root` and `/var`, run busybox's tools, and hand back an
//! artifact byte for byte. Where the image has a C toolchain (`cc` and `make`), it also builds
//! and runs a C program; the busybox image has none, and the job says so in its output.

use std::path::Path;

use api_types::CreateSandbox;
use harness::TestDaemon;
use sha2::{Digest, Sha256};
use wire::ExecRequest;

const BUILD_SH: &str = r#"set -eu
mkdir -p out
for f in src/*.txt; do
  name=$(basename "$f" .txt)
  tr ' ' '\n' < "$f" | grep -v '^$' | sort | uniq -c | awk '{print $2, $1}' > "out/$name.counts"
done
sha256sum src/*.txt > out/SHA256SUMS
sed 's/crucible/CRUCIBLE/g' src/words.txt | gzip -9 > out/words.upper.gz
id -u > out/built-by
"#;

const TESTS_SH: &str = r#"set -eu
test "$(cat out/built-by)" = 1001
sha256sum -c out/SHA256SUMS
zcat out/words.upper.gz | grep -q CRUCIBLE
test "$(grep '^sandbox ' out/words.counts)" = "sandbox 3"
echo tests passed
"#;

const JOB_SH: &str = r#"set -eu
# Set the system up as a package manager would.
echo 'ci:x:1001:1001:CI user:/home/ci:/bin/sh' >> /etc/passwd
echo 'ci:x:1001:' >> /etc/group
mkdir -p /home/ci /etc/myapp /var/cache/myapp /root/.cache /usr/local/bin /opt/tool/bin
echo 'level=debug' > /etc/myapp/config
echo warm > /var/cache/myapp/state
echo token > /root/.cache/credentials && chmod 600 /root/.cache/credentials
cp /work/project/tool.sh /opt/tool/bin/tool && chmod 755 /opt/tool/bin/tool
ln -sf /opt/tool/bin/tool /usr/local/bin/tool
tool > /tmp/tool.out
chown -R ci:ci /work/project /home/ci
# Build as the unprivileged user, then test as root.
su -s /bin/sh ci -c 'cd /work/project && sh build.sh'
test "$(stat -c %U:%G /work/project/out/SHA256SUMS)" = ci:ci
cd /work/project && sh tests.sh
if command -v cc >/dev/null 2>&1 && command -v make >/dev/null 2>&1; then
  printf 'hello:\n\tcc -o hello hello.c\n' > /tmp/Makefile
  printf '#include <stdio.h>\nint main(void){puts("compiled");return 0;}\n' > /tmp/hello.c
  make -s -C /tmp hello && /tmp/hello
else
  echo "no C toolchain in this image"
fi
tar -C /work/project -czf /tmp/artifact.tgz out
"#;

#[tokio::test]
async fn a_ci_job_installs_builds_as_another_user_tests_and_hands_back_its_artifact() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = c
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;

    let project = tempfile::tempdir().expect("temp dir");
    let root = project.path().join("project");
    std::fs::create_dir_all(root.join("src")).expect("mkdir");
    let words = "crucible sandbox ci crucible sandbox job sandbox build";
    let notes = "boundary user namespace seccomp boundary";
    for (path, text) in [
        ("src/words.txt", words),
        ("src/notes.txt", notes),
        ("build.sh", BUILD_SH),
        ("tests.sh", TESTS_SH),
        ("tool.sh", "#!/bin/sh\necho tool installed\n"),
    ] {
        std::fs::write(root.join(path), text).expect("write");
    }
    let put = c.put_path(&id, &root, "/work").await.expect("upload");
    assert_eq!(put.files, 5, "{put:?}");

    let out = c
        .exec_collect(&id, &ExecRequest::new(["sh", "-c", JOB_SH]))
        .await
        .expect("exec");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.result.exit_code, 0, "the job failed: {stdout}{stderr}");
    assert!(stdout.contains("tests passed"), "{stdout}");
    assert!(
        stdout.contains("compiled") || stdout.contains("no C toolchain in this image"),
        "{stdout}"
    );

    // The artifact comes back byte for byte; its contents are what the build should make.
    let mut artifact = Vec::new();
    c.get_file(&id, "/tmp/artifact.tgz", &mut artifact)
        .await
        .expect("download");
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&artifact[..]));
    let mut files = std::collections::BTreeMap::new();
    for entry in archive.entries().expect("a tar.gz") {
        let mut entry = entry.expect("entry");
        let name = entry.path().expect("path").display().to_string();
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut body).expect("read");
        files.insert(name, body);
    }
    let text = |name: &str| {
        String::from_utf8(files.get(name).cloned().unwrap_or_default()).expect("utf-8")
    };
    assert_eq!(text("out/built-by").trim(), "1001");
    assert!(
        text("out/words.counts").contains("sandbox 3\n"),
        "{files:?}"
    );
    let sums = text("out/SHA256SUMS");
    let expected = hex::encode(Sha256::digest(words.as_bytes()));
    assert!(
        sums.contains(&format!("{expected}  src/words.txt")),
        "{sums}"
    );

    // Root's edits live in the sandbox only: the image on the host is untouched.
    let image = harness::image_dir().join("rootfs");
    for path in ["etc/myapp", "opt/tool", "home/ci", "work"] {
        assert!(
            !Path::new(&image).join(path).exists(),
            "{path} reached the image"
        );
    }
    let passwd = std::fs::read_to_string(image.join("etc/passwd")).unwrap_or_default();
    assert!(
        !passwd.contains("ci:x:1001"),
        "the image's /etc/passwd was written"
    );
}
