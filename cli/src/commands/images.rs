//! `crucible image import | ls | inspect | rm`: the daemon's image store.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio::io::{AsyncRead, ReadBuf};

use crate::output;
use crate::Global;

/// `crucible image import NAME SOURCE`.
#[derive(clap::Args)]
pub(crate) struct ImportArgs {
    /// The image's name, as `--image NAME` and `{"image": NAME}` give it (letters, digits and
    /// `._:/-`; `rust:1.80` and `ghcr.io/org/ci:latest` are names). An image of yours with the
    /// same name is replaced; sandboxes already using it keep the old one.
    pub name: String,
    /// What to import: a `docker save` archive, an OCI archive (`.tar`), an OCI image layout
    /// directory, a rootfs tarball (`.tar`, `.tar.gz`), a directory holding a root filesystem,
    /// or `-` for an archive on stdin.
    pub source: PathBuf,
}

/// Counts the bytes read through it, for the progress line.
struct Counting<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Counting<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let added = buf.filled().len() - before;
        self.read.fetch_add(added as u64, Ordering::Relaxed);
        polled
    }
}

/// What is sent: a file as it is, or a directory tarred on the fly.
enum Source {
    File(PathBuf, u64),
    Stdin,
    Directory(PathBuf, &'static str),
}

fn source(path: &Path) -> Result<Source> {
    if path == Path::new("-") {
        return Ok(Source::Stdin);
    }
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    if meta.is_dir() {
        let kind = if path.join("oci-layout").is_file() {
            "an OCI image layout"
        } else {
            "a root filesystem"
        };
        return Ok(Source::Directory(path.to_path_buf(), kind));
    }
    if !meta.is_file() {
        bail!("{} is neither a file nor a directory", path.display());
    }
    Ok(Source::File(path.to_path_buf(), meta.len()))
}

/// Tars `dir` into `writer`: an OCI layout as its files are, a root filesystem with owners,
/// modes and links kept (device nodes and sockets left out, as the daemon would drop them).
fn tar_directory(dir: &Path, oci_layout: bool, writer: impl std::io::Write) -> Result<()> {
    let mut tar = tar::Builder::new(writer);
    tar.follow_symlinks(false);
    if oci_layout {
        tar.append_dir_all(".", dir)
            .with_context(|| format!("reading {}", dir.display()))?;
    } else {
        let skipped = oci::write::append_tree(&mut tar, dir)
            .with_context(|| format!("reading {}", dir.display()))?;
        if skipped.devices + skipped.sockets > 0 {
            eprintln!(
                "crucible: left out {} device nodes and {} sockets (a sandbox has its own /dev)",
                skipped.devices, skipped.sockets
            );
        }
    }
    let mut out = tar.into_inner().context("finishing the archive")?;
    out.flush().context("sending the archive")?;
    Ok(())
}

pub(crate) async fn import(global: &Global, args: ImportArgs) -> Result<()> {
    let client = global.client()?;
    let source = source(&args.source)?;
    let sent = Arc::new(AtomicU64::new(0));
    let (total, what) = match &source {
        Source::File(path, len) => (Some(*len), format!("{}", path.display())),
        Source::Stdin => (None, "stdin".to_string()),
        Source::Directory(path, kind) => (None, format!("{kind} at {}", path.display())),
    };
    let bar = progress_bar(total, &args.name, &what);
    let started = Instant::now();
    let (reader, tarring): (Box<dyn AsyncRead + Send + Unpin>, _) = match source {
        Source::File(path, _) => {
            let file = tokio::fs::File::open(&path)
                .await
                .with_context(|| format!("opening {}", path.display()))?;
            (Box::new(file), None)
        }
        Source::Stdin => (Box::new(tokio::io::stdin()), None),
        Source::Directory(dir, kind) => {
            let (writer, reader) = tokio::io::duplex(256 * 1024);
            let oci_layout = kind == "an OCI image layout";
            let task = tokio::task::spawn_blocking(move || {
                let mut bridge = tokio_util::io::SyncIoBridge::new(writer);
                let result = tar_directory(&dir, oci_layout, &mut bridge);
                let _ = bridge.shutdown();
                result
            });
            (Box::new(reader), Some(task))
        }
    };
    let counting = Counting {
        inner: reader,
        read: sent.clone(),
    };
    let ticker = {
        let (bar, sent) = (bar.clone(), sent.clone());
        tokio::spawn(async move {
            loop {
                let now = sent.load(Ordering::Relaxed);
                bar.set_position(now);
                if total.is_some_and(|t| now >= t) {
                    bar.set_message("unpacking on the daemon");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let result = client.import_image(&args.name, counting).await;
    ticker.abort();
    bar.finish_and_clear();
    // The daemon's answer first: when it refuses the import it stops reading, and the tarring
    // then fails with a broken pipe that says nothing about why.
    let image = result.with_context(|| format!("importing {what} as {:?}", args.name))?;
    if let Some(task) = tarring {
        task.await.context("tarring the directory")??;
    }
    if global.json {
        return output::print_json(&image);
    }
    eprintln!(
        "crucible: imported {} ({}, {} layer{}, {} files, {:.1} MiB unpacked) from {:.1} MiB in {:.1} s",
        output::escape(&image.name),
        output::escape(&image.format),
        image.layers.len(),
        if image.layers.len() == 1 { "" } else { "s" },
        image.entries,
        image.size_bytes as f64 / 1048576.0,
        sent.load(Ordering::Relaxed) as f64 / 1048576.0,
        started.elapsed().as_secs_f64()
    );
    if image.dropped_devices > 0 {
        eprintln!(
            "crucible: {} device nodes in its layers were not created (a sandbox has its own /dev)",
            image.dropped_devices
        );
    }
    println!("{}", output::escape(&image.name));
    Ok(())
}

fn progress_bar(total: Option<u64>, name: &str, what: &str) -> indicatif::ProgressBar {
    let bar = match total {
        Some(total) => indicatif::ProgressBar::new(total),
        None => indicatif::ProgressBar::new_spinner(),
    };
    let template = match total {
        Some(_) => "{spinner} {prefix} {bytes}/{total_bytes} ({bytes_per_sec}) {msg}",
        None => "{spinner} {prefix} {bytes} ({bytes_per_sec}) {msg}",
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.set_prefix(format!("importing {what} as {name}:"));
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

pub(crate) async fn list(global: &Global) -> Result<()> {
    let images = global.client()?.images().await?;
    if global.json {
        return output::print_json(&api_types::ImageList { images });
    }
    print!("{}", output::image_table(&images));
    Ok(())
}

pub(crate) async fn inspect(global: &Global, name: &str) -> Result<()> {
    let image = global.client()?.image(name).await?;
    output::print_json(&image)
}

pub(crate) async fn remove(global: &Global, names: &[String]) -> Result<()> {
    let client = global.client()?;
    let mut failed = None;
    for name in names {
        if let Err(e) = client.delete_image(name).await {
            eprintln!(
                "crucible: image {}: {}",
                output::escape(name),
                output::chain(&e)
            );
            failed = Some(e);
        }
    }
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// `crucible image prune`: which of your images to remove.
#[derive(clap::Args)]
pub(crate) struct PruneArgs {
    /// Only images no sandbox has used (nor anyone imported) for this long: 90 (seconds),
    /// 90s, 15m, 24h, 7d [default: 0, any image not in use].
    #[arg(long, value_name = "DURATION", value_parser = duration_s, default_value = "0")]
    pub unused_for: u64,
    /// Only images whose name starts with this (`containerd-` for the containerd shim's).
    #[arg(long, value_name = "PREFIX", default_value = "")]
    pub prefix: String,
}

/// Seconds in `90`, `90s`, `15m`, `24h` or `7d`.
fn duration_s(text: &str) -> Result<u64, String> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: expected a number with s, m, h or d")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("{text:?}: expected a number with s, m, h or d"))
}

pub(crate) async fn prune(global: &Global, args: &PruneArgs) -> Result<()> {
    let pruned = global
        .client()?
        .prune_images(args.unused_for, &args.prefix)
        .await?;
    if global.json {
        return output::print_json(&pruned);
    }
    for name in &pruned.removed {
        println!("{}", output::escape(name));
    }
    eprintln!(
        "removed {} image(s), reclaimed {:.1} MiB",
        pruned.removed.len(),
        pruned.reclaimed_bytes as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::duration_s;

    #[test]
    fn durations_take_seconds_or_a_unit() {
        assert_eq!(duration_s("90"), Ok(90));
        assert_eq!(duration_s("90s"), Ok(90));
        assert_eq!(duration_s("15m"), Ok(900));
        assert_eq!(duration_s("24h"), Ok(86_400));
        assert_eq!(duration_s("7d"), Ok(604_800));
        assert!(duration_s("1w").is_err());
        assert!(duration_s("h").is_err());
        assert!(duration_s("-5").is_err());
    }
}
