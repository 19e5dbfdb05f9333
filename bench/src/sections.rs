//! The parts of the suite, so that `--only` can run a few of them.

/// One part of the suite (`--only`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Section {
    /// The host floor: fork+exec, posix_spawn, Unix-socket ping-pong and stream, the host's
    /// `head`/`dd` into a pipe, a host tar extraction (most ratios are taken against it).
    Floor,
    /// crucible-vmm's own memory and boot timings with the I/O test guest under KVM.
    Vmm,
    /// Create → ready and time to interactive.
    Create,
    /// Exec round trips (API, agent socket, the daemon's share).
    Exec,
    /// Stdout throughput and the interactive echo.
    Streaming,
    /// Uploads and downloads.
    Files,
    /// Creates and execs at once, sustained creation.
    Concurrency,
    /// nsenter, bubblewrap and unshare + pivot_root.
    Peers,
    /// The daemon's memory and the host memory per sandbox.
    Footprint,
    /// MicroVMs under QEMU TCG.
    Tcg,
    /// The egress proxy next to a direct host connection (its floor is measured with it).
    Egress,
    /// A sandbox with containers beside single sandboxes; a job beside a service.
    Pods,
    /// The exec round trip through the Python and TypeScript SDKs, each beside raw HTTP in
    /// its own process.
    Sdk,
    /// crucible-vmm's boot beside QEMU microvm's, both under KVM inside the nested tier's L1
    /// (nested TCG: ratios and exit counts, not absolute times). Not in --quick.
    Nested,
}

impl Section {
    /// The name `--only` takes.
    pub(crate) fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_string())
            .unwrap_or_else(|| format!("{self:?}").to_lowercase())
    }
}

/// Which sections a run measures: every one, or those `--only` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Selection {
    only: Option<Vec<Section>>,
}

impl Selection {
    /// The whole suite.
    pub(crate) fn all() -> Self {
        Selection { only: None }
    }

    /// Just `sections` (the whole suite when empty).
    pub(crate) fn only(sections: &[Section]) -> Self {
        Selection {
            only: (!sections.is_empty()).then(|| sections.to_vec()),
        }
    }

    /// Whether `section` runs.
    pub(crate) fn has(&self, section: Section) -> bool {
        self.only.as_ref().is_none_or(|s| s.contains(&section))
    }

    /// Whether any of `sections` runs.
    pub(crate) fn any(&self, sections: &[Section]) -> bool {
        sections.iter().any(|&s| self.has(s))
    }

    /// Whether this is part of the suite only.
    pub(crate) fn is_partial(&self) -> bool {
        self.only.is_some()
    }

    /// The `--only` argument that selects it, or nothing for the whole suite.
    pub(crate) fn arg(&self) -> Option<String> {
        self.only.as_ref().map(|sections| {
            let names: Vec<String> = sections.iter().map(|s| s.name()).collect();
            format!("--only {}", names.join(","))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_selects_the_named_sections_and_nothing_selects_all() {
        let all = Selection::all();
        assert!(all.has(Section::Floor) && all.has(Section::Egress));
        assert!(!all.is_partial());
        assert_eq!(all.arg(), None);
        assert_eq!(Selection::only(&[]), all);

        let some = Selection::only(&[Section::Egress, Section::Floor]);
        assert!(some.has(Section::Egress) && some.has(Section::Floor));
        assert!(!some.has(Section::Exec));
        assert!(some.any(&[Section::Exec, Section::Floor]));
        assert!(!some.any(&[Section::Exec, Section::Create]));
        assert_eq!(some.arg().as_deref(), Some("--only egress,floor"));
    }
}
