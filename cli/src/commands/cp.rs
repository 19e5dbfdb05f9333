//! `crucible cp`: files in and out of a sandbox.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tokio::io::AsyncWriteExt;

use crate::{output, Global};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// LOCAL path to upload, or ID:PATH to download: a file, or a directory whole (its files'
    /// modes and times kept, never setuid; hard links and devices are not made).
    pub source: String,
    /// ID:DIR to upload into, or LOCAL path (file, directory, or `-` for stdout; a downloaded
    /// directory goes beneath an existing LOCAL directory, or becomes LOCAL).
    pub destination: String,
}

/// `ID:PATH` when `text` names a sandbox path.
fn remote(text: &str) -> Option<(&str, &str)> {
    let (id, path) = text.split_once(':')?;
    (id.starts_with("sb-") && !id.contains('/')).then_some((id, path))
}

pub(crate) async fn run(global: &Global, args: Args) -> Result<()> {
    let client = global.client()?;
    match (remote(&args.source), remote(&args.destination)) {
        (None, Some((id, dir))) => {
            let local = Path::new(&args.source);
            if !local.exists() {
                bail!("{} does not exist", local.display());
            }
            let dir = if dir.is_empty() { "/" } else { dir };
            let result = client.put_path(id, local, dir).await?;
            if global.json {
                return output::print_json(&result);
            }
            eprintln!(
                "copied {} files, {} directories, {} bytes to {id}:{dir}",
                result.files, result.dirs, result.bytes
            );
            Ok(())
        }
        (Some((id, path)), None) => {
            let written = if args.destination == "-" {
                let mut out = tokio::io::stdout();
                client.get_file(id, path, &mut out).await?
            } else {
                let mut target = PathBuf::from(&args.destination);
                if target.is_dir() {
                    let name = Path::new(path)
                        .file_name()
                        .with_context(|| format!("{path} names no file"))?;
                    target.push(name);
                }
                let partial = target.with_extension("crucible-partial");
                let mut file = tokio::fs::File::create(&partial)
                    .await
                    .with_context(|| format!("creating {}", partial.display()))?;
                let result = client.download_file(id, path, &mut file).await;
                file.flush().await?;
                drop(file);
                match result {
                    Ok(download) => {
                        keep_mode_and_time(&partial, &download)?;
                        tokio::fs::rename(&partial, &target)
                            .await
                            .with_context(|| format!("writing {}", target.display()))?;
                        download.bytes
                    }
                    Err(client::ClientError::Api { code, .. }) if code == "is_a_directory" => {
                        let _ = tokio::fs::remove_file(&partial).await;
                        return directory(global, &client, id, path, &target).await;
                    }
                    Err(e) => {
                        let _ = tokio::fs::remove_file(&partial).await;
                        return Err(e.into());
                    }
                }
            };
            if global.json {
                return output::print_json(&serde_json::json!({ "bytes": written }));
            }
            if args.destination != "-" {
                eprintln!("copied {written} bytes from {id}:{path}");
            }
            Ok(())
        }
        (Some(_), Some(_)) => {
            bail!("copying between two sandboxes is not supported; go through a local path")
        }
        (None, None) => {
            bail!("one side must be a sandbox path, ID:PATH (e.g. sb-0123456789abcdef:/work)")
        }
    }
}

/// `crucible cp ID:DIR LOCAL`: the directory, whole, made at `target` (which must not exist).
async fn directory(
    global: &Global,
    client: &client::Client,
    id: &str,
    dir: &str,
    target: &Path,
) -> Result<()> {
    let made = super::cp_dir::download(client, id, dir, target).await?;
    for skipped in &made.skipped {
        eprintln!("crucible: warning: not copied: {skipped}");
    }
    if global.json {
        return output::print_json(&made);
    }
    eprintln!(
        "copied {} files, {} directories, {} links, {} bytes from {id}:{dir} to {}",
        made.files,
        made.dirs,
        made.links,
        made.bytes,
        target.display()
    );
    Ok(())
}

/// Gives a downloaded file the time and permission bits it had in the sandbox, as `cp -p`
/// does, but never setuid, setgid or sticky: a sandbox must not plant a setuid file on the
/// host of whoever downloads it (often root).
fn keep_mode_and_time(file: &Path, download: &client::Download) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(modified) = download.modified {
        std::fs::OpenOptions::new()
            .write(true)
            .open(file)
            .and_then(|f| f.set_modified(modified))
            .with_context(|| format!("setting the time of {}", file.display()))?;
    }
    if let Some(mode) = download.mode {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode & 0o777))
            .with_context(|| format!("setting the mode of {}", file.display()))?;
    }
    Ok(())
}
