//! `crucible sandbox create | ls | get | rm`.

use anyhow::Result;
use wire::{BackendKind, CreateSandbox};

use crate::output;
use crate::Global;

#[derive(clap::Args, Clone, Default)]
pub struct CreateArgs {
    /// Memory limit in MiB.
    #[arg(long, value_name = "MIB")]
    pub memory: Option<u64>,
    /// vCPUs (microVM) or CPU quota (namespace).
    #[arg(long)]
    pub vcpus: Option<u32>,
    /// Lifetime in seconds.
    #[arg(long, value_name = "SECONDS")]
    pub ttl: Option<u64>,
    /// Backend: microvm or namespace [default: the daemon's choice].
    #[arg(long, value_parser = crate::serve::parse_backend)]
    pub backend: Option<BackendKind>,
    /// Image name.
    #[arg(long)]
    pub image: Option<String>,
    /// Environment for every command in the sandbox (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = super::key_value)]
    pub env: Vec<(String, String)>,
    /// Labels (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = super::key_value)]
    pub labels: Vec<(String, String)>,
}

impl CreateArgs {
    pub fn request(&self) -> CreateSandbox {
        CreateSandbox {
            memory_mib: self.memory,
            vcpus: self.vcpus,
            image: self.image.clone(),
            backend: self.backend,
            ttl_s: self.ttl,
            env: self.env.iter().cloned().collect(),
            labels: self.labels.iter().cloned().collect(),
        }
    }
}

pub async fn create(global: &Global, args: CreateArgs) -> Result<()> {
    let info = global.client()?.create(&args.request()).await?;
    if global.json {
        output::print_json(&info)
    } else {
        println!("{}", info.id);
        Ok(())
    }
}

pub async fn list(global: &Global) -> Result<()> {
    let sandboxes = global.client()?.list().await?;
    if global.json {
        return output::print_json(&wire::SandboxList { sandboxes });
    }
    print!("{}", output::sandbox_table(&sandboxes));
    Ok(())
}

pub async fn get(global: &Global, id: &str) -> Result<()> {
    let info = global.client()?.get(id).await?;
    if global.json {
        return output::print_json(&info);
    }
    print!("{}", output::sandbox_details(&info));
    Ok(())
}

pub async fn remove(global: &Global, ids: &[String]) -> Result<()> {
    let client = global.client()?;
    let mut failed = None;
    for id in ids {
        match client.delete(id).await {
            Ok(()) => {
                if !global.json {
                    println!("{id}");
                }
            }
            Err(e) => {
                eprintln!("crucible: error: {id}: {e}");
                failed = Some(e);
            }
        }
    }
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
