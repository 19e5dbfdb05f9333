//! `cargo xtask build-image` and `cargo xtask smoke-image`: thin front ends to `crucible-guest-image`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use guest_image::progress::{format_duration, format_size};
use guest_image::smoke::{self, SmokeOptions};
use guest_image::{
    AgentSource, Compression, ImageBuilder, ImageOptions, KernelSource, Manifest, Progress,
    RootfsSource,
};
use indicatif::{ProgressBar, ProgressStyle};

use crate::util::workspace_root;

fn default_out() -> PathBuf {
    workspace_root().join("target/crucible/image")
}

#[derive(clap::Args)]
pub(crate) struct BuildArgs {
    /// Output directory [default: target/crucible/image].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Build the kernel from this source tree instead of Debian's linux-source-6.12.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kernel", "no_kernel"])]
    kernel_src: Option<PathBuf>,
    /// Use this vmlinux (must have the PVH note) instead of building one.
    #[arg(long, value_name = "FILE", conflicts_with = "no_kernel")]
    kernel: Option<PathBuf>,
    /// No kernel: only the initramfs (and rootfs), as the namespace backend needs.
    #[arg(long)]
    no_kernel: bool,
    /// Also write rootfs.ext4: from a directory, or `debian` (debootstrap bookworm minbase).
    #[arg(long, value_name = "DIR|debian")]
    rootfs: Option<String>,
    /// Extra Debian packages for `--rootfs debian`, comma-separated (e.g. python3,git).
    #[arg(long, value_name = "a,b", value_delimiter = ',', requires = "rootfs")]
    packages: Vec<String>,
    /// Use this guest-init binary instead of building the `guest-init` crate.
    #[arg(long, value_name = "FILE")]
    agent: Option<PathBuf>,
    /// Initramfs compression.
    #[arg(long, value_enum, default_value = "none")]
    compression: CompressionArg,
    /// Rebuild the kernel and the rootfs tree even when cached.
    #[arg(long)]
    force: bool,
    /// Parallel jobs for the kernel build [default: number of CPUs].
    #[arg(long, short = 'j')]
    jobs: Option<usize>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CompressionArg {
    None,
    Gzip,
}

#[derive(clap::Args)]
pub(crate) struct SmokeArgs {
    /// Directory holding the built image [default: target/crucible/image].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Fail (and kill QEMU) if the VM has not ended itself after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Extra kernel command-line arguments.
    #[arg(long, value_name = "ARG")]
    append: Vec<String>,
    /// Also attach the image's rootfs.ext4 and boot into it (read-only + tmpfs overlay).
    #[arg(long)]
    rootfs: bool,
    /// Print the whole console log even when the test passes.
    #[arg(long, short)]
    verbose: bool,
}

/// Cargo-like progress: a spinner per phase on a terminal, plain lines otherwise.
struct Reporter {
    bar: Mutex<Option<ProgressBar>>,
    tty: bool,
}

impl Reporter {
    fn new() -> Self {
        Reporter {
            bar: Mutex::new(None),
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn line(&self, text: &str) {
        let guard = self.bar.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(bar) if self.tty => bar.println(text),
            _ => eprintln!("{text}"),
        }
    }
}

impl Progress for Reporter {
    fn phase_started(&self, phase: &str) {
        if !self.tty {
            eprintln!("{:>12} {phase}", "Building");
            return;
        }
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner:.green} {prefix:>10.cyan.bold} [{elapsed}] {wide_msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_prefix(phase.to_string());
        bar.enable_steady_tick(Duration::from_millis(100));
        *self.bar.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar);
    }

    fn status(&self, message: &str) {
        let guard = self.bar.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(bar) if self.tty => bar.set_message(message.to_string()),
            _ => eprintln!("{:>12} {message}", ""),
        }
    }

    fn note(&self, message: &str) {
        self.line(&format!("{:>12} {message}", "Note"));
    }

    fn phase_finished(&self, phase: &str, elapsed: Duration, detail: &str) {
        if let Some(bar) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
            bar.finish_and_clear();
        }
        eprintln!(
            "{:>12} {phase}: {detail} in {}",
            "Finished",
            format_duration(elapsed)
        );
    }

    fn phase_failed(&self, phase: &str, elapsed: Duration) {
        if let Some(bar) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
            bar.finish_and_clear();
        }
        eprintln!(
            "{:>12} {phase} after {}",
            "Failed",
            format_duration(elapsed)
        );
    }
}

pub(crate) fn build(args: BuildArgs) -> Result<()> {
    let out = args.out.unwrap_or_else(default_out);
    let mut opts = ImageOptions::new(out.clone(), workspace_root());
    opts.kernel = if args.no_kernel {
        None
    } else if let Some(file) = args.kernel {
        Some(KernelSource::Prebuilt(file))
    } else if let Some(dir) = args.kernel_src {
        Some(KernelSource::Tree(dir))
    } else {
        Some(KernelSource::Debian)
    };
    if let Some(agent) = args.agent {
        opts.agent = AgentSource::Prebuilt(agent);
    }
    opts.rootfs = match args.rootfs.as_deref() {
        None => None,
        Some("debian") => Some(RootfsSource::Debian {
            packages: args.packages.clone(),
        }),
        Some(dir) => {
            if !args.packages.is_empty() {
                bail!("--packages only applies to --rootfs debian");
            }
            Some(RootfsSource::Dir(PathBuf::from(dir)))
        }
    };
    opts.compression = match args.compression {
        CompressionArg::None => Compression::None,
        CompressionArg::Gzip => Compression::Gzip,
    };
    opts.force = args.force;
    opts.jobs = args.jobs;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    eprintln!(
        "{:>12} guest image into {} (cache: {})",
        "Building",
        out.display(),
        opts.cache.root().display()
    );

    let reporter = Reporter::new();
    let manifest = ImageBuilder::new(opts)
        .build(&reporter)
        .context("build-image failed")?;
    print_summary(&manifest, &out);
    Ok(())
}

fn print_summary(m: &Manifest, out: &std::path::Path) {
    println!();
    println!(
        "{:<20} {:>10}  {:<12}  origin",
        "artifact", "size", "sha256"
    );
    for a in m.artifacts() {
        println!(
            "{:<20} {:>10}  {:<12}  {}",
            a.file,
            format_size(a.size),
            &a.sha256[..12.min(a.sha256.len())],
            a.origin.as_str()
        );
    }
    println!(
        "{:<20} {:>10}  {:<12}  {} ({})",
        "(agent /init)",
        format_size(m.agent.size),
        &m.agent.sha256[..12.min(m.agent.sha256.len())],
        m.agent.source,
        m.agent.target
    );
    println!();
    println!(
        "wrote {} in {:.1}s",
        out.join(guest_image::manifest::FILE_NAME).display(),
        m.build_seconds
    );
    if let Some(rootfs) = &m.rootfs_info {
        // rootfs.ext4 is what a microVM boots when it asks for the built-in image; every
        // backend runs the tree once it is imported into a daemon as an image of its own.
        println!();
        println!("to run this root on every backend (namespace sandboxes too), import it:");
        println!("  crucible image import debian {}", rootfs.tree.display());
        println!("then create sandboxes with --image debian");
    }
}

pub(crate) fn smoke(args: SmokeArgs) -> Result<()> {
    let dir = args.dir.unwrap_or_else(default_out);
    let manifest = Manifest::read(&dir)?;
    let changed = manifest.verify(&dir)?;
    if !changed.is_empty() {
        bail!(
            "{} changed since manifest.json was written; run `cargo xtask build-image` again",
            changed.join(", ")
        );
    }
    let Some(vmlinux) = &manifest.vmlinux else {
        bail!(
            "{} has no vmlinux (built with --no-kernel?); run `cargo xtask build-image`",
            dir.display()
        );
    };
    let mut opts = SmokeOptions::new(dir.join(&vmlinux.file), dir.join(&manifest.initramfs.file));
    opts.timeout = Duration::from_secs(args.timeout);
    opts.extra_append = args.append;
    if args.rootfs {
        let Some(rootfs) = &manifest.rootfs else {
            bail!(
                "{} has no rootfs.ext4; build with `cargo xtask build-image --rootfs DIR|debian`",
                dir.display()
            );
        };
        opts.rootfs = Some(dir.join(&rootfs.file));
    }
    let reporter = Reporter::new();
    reporter.phase_started("smoke");
    reporter.status(&format!(
        "booting {} + {}{} under qemu microvm (tcg)",
        vmlinux.file,
        manifest.initramfs.file,
        if args.rootfs { " + rootfs.ext4" } else { "" }
    ));
    let run = match smoke::boot(&opts, &dir.join("logs"), &reporter) {
        Ok(run) => run,
        Err(e) => {
            reporter.phase_failed("smoke", Duration::ZERO);
            return Err(e.into());
        }
    };
    let log = dir.join("logs/smoke-console.log");
    std::fs::write(&log, &run.console).with_context(|| format!("writing {}", log.display()))?;
    let facts = smoke::parse_console(&run.console);
    let problems = smoke::problems(&run, &facts, opts.timeout);
    let ready = run
        .ready_after
        .map(format_duration)
        .unwrap_or_else(|| "never".into());
    if !problems.is_empty() {
        reporter.phase_failed("smoke", run.total);
        eprintln!("--- console ({}) ---", log.display());
        eprint!("{}", run.console);
        eprintln!("--- end of console ---");
        eprintln!("command: {}", run.command);
        for p in &problems {
            eprintln!("  problem: {p}");
        }
        bail!("smoke-image failed: {} problem(s)", problems.len());
    }
    let agent = facts.ready.as_ref();
    reporter.phase_finished(
        "smoke",
        run.total,
        &format!(
            "agent {} up as pid 1 on kernel {} after {ready} ({} ms guest uptime), {} selftests ok, VM ended itself",
            agent.map(|r| r.version.as_str()).unwrap_or("?"),
            agent.map(|r| r.kernel.as_str()).unwrap_or("?"),
            agent.map(|r| r.uptime_ms).unwrap_or(0),
            smoke::SELFTESTS.len(),
        ),
    );
    if args.verbose {
        eprint!("{}", run.console);
    }
    println!(
        "smoke-image passed: ready after {ready}, QEMU exited after {} (console: {})",
        format_duration(run.total),
        log.display()
    );
    Ok(())
}
