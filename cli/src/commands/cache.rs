//! `crucible cache ls | rm`.

use anyhow::Result;

use crate::output;
use crate::Global;

pub(crate) async fn list(global: &Global) -> Result<()> {
    let caches = global.client()?.caches().await?;
    if global.json {
        return output::print_json(&api_types::CacheList { caches });
    }
    print!("{}", output::cache_table(&caches));
    Ok(())
}

/// Deletes the named caches, or with `all` every one not in use (saying which were kept).
pub(crate) async fn remove(global: &Global, names: &[String], all: bool) -> Result<()> {
    let client = global.client()?;
    if all {
        let kept = client.clear_caches().await?;
        for cache in &kept {
            eprintln!(
                "crucible: kept cache {}: in use by {}",
                output::escape(&cache.name),
                output::escape(cache.in_use_by.as_deref().unwrap_or("a sandbox"))
            );
        }
        anyhow::ensure!(kept.is_empty(), "{} caches in use were kept", kept.len());
        return Ok(());
    }
    anyhow::ensure!(
        !names.is_empty(),
        "name the caches to delete, or give --all"
    );
    let mut failed = None;
    for name in names {
        if let Err(e) = client.delete_cache(name).await {
            eprintln!(
                "crucible: cache {}: {}",
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
