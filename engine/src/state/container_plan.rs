//! Turning a create request's `containers` and `shared` into what the backend makes (each
//! container's image tree, the shared mounts) and what the daemon runs in them (each one's
//! main process, env, user, checks): every field checked, with its place in the request named
//! in the error.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use api_types::{ContainerRequest, CreateSandbox};

use crate::backend::{Capabilities, ContainerSecurity, ImagePaths};
use crate::owner::Owner;
use crate::sandbox::containers::{ContainerPlan, MAIN_CONTAINER, MAX_CONTAINERS};
use crate::sandbox::{AddContainerError, Sandbox};
use crate::state::{CreateError, Engine};
use crate::storage::DEFAULT_IMAGE;
use crate::storage::{check_in_image, validate_targets};

/// Everything a request's containers need, resolved.
#[derive(Debug, Default)]
pub(crate) struct ContainersPlan {
    /// What runs in each, in the request's order.
    pub(crate) containers: Vec<ContainerPlan>,
    /// Each one's image tree, for the backend.
    pub(crate) roots: Vec<namespace::ContainerRoot>,
    /// The shared directories' mounts, the sandbox's own root's (`main`) among them.
    pub(crate) shared: Vec<namespace::SharedMount>,
    /// The imported images they use, held while the sandbox lives.
    pub(crate) leases: Vec<oci::ImageLease>,
    /// Each one's imported image, in order (`None`: the daemon's own image), for a microVM's
    /// image disks.
    pub(crate) images: Vec<Option<oci::ImageRecord>>,
}

impl Engine {
    /// Checks and resolves `request`'s containers for `owner`; an empty plan when it has none.
    /// `main_root`: the sandbox's own image tree where its backend refuses a mount point
    /// reached through a symlink (a namespace sandbox's), to check its shared mounts against.
    pub(crate) fn plan_containers(
        &self,
        request: &CreateSandbox,
        owner: &Owner,
        main_root: Option<&Path>,
    ) -> Result<ContainersPlan, CreateError> {
        let mut plan = ContainersPlan::default();
        if request.containers.is_empty() && request.shared.is_empty() {
            return Ok(plan);
        }
        let invalid = |what: String| CreateError::Invalid(what);
        if request.containers.len() > MAX_CONTAINERS {
            return Err(invalid(format!(
                "containers: {} asked for, a sandbox holds at most {MAX_CONTAINERS}",
                request.containers.len()
            )));
        }
        let mut names = BTreeSet::new();
        for (i, container) in request.containers.iter().enumerate() {
            namespace::pod::check_name(&container.name, "name")
                .map_err(|e| invalid(format!("containers[{i}].{e}")))?;
            if container.name == MAIN_CONTAINER {
                return Err(invalid(format!(
                    "containers[{i}].name: {MAIN_CONTAINER:?} is the sandbox's own root"
                )));
            }
            if !names.insert(container.name.as_str()) {
                return Err(invalid(format!(
                    "containers[{i}].name: {:?} is asked for twice",
                    container.name
                )));
            }
        }
        for (i, container) in request.containers.iter().enumerate() {
            if !container.host_paths.is_empty() {
                return Err(invalid(format!(
                    "containers[{i}].host_paths: only a container added to a running sandbox \
                     (POST /sandboxes/{{id}}/containers) mounts host paths"
                )));
            }
            for dependency in &container.depends_on {
                if !names.contains(dependency.as_str()) || dependency == &container.name {
                    return Err(invalid(format!(
                        "containers[{i}].depends_on: {dependency:?} is not another container \
                         of this sandbox"
                    )));
                }
            }
        }
        check_no_cycle(&request.containers)?;
        plan.shared = shared_mounts(request)?;
        if let Some(root) = main_root {
            let image = request.image.as_deref().unwrap_or(DEFAULT_IMAGE);
            check_shared_in_image("", &request.shared, root, image)?;
        }
        for (i, container) in request.containers.iter().enumerate() {
            let field = format!("containers[{i}] ({}).", container.name);
            let (resolved, mut root, image) =
                self.plan_one(&field, container, owner, &mut plan.leases)?;
            root.share_pids |= request.share_process_namespace;
            if root.share_pids && root.command_is_pid1 {
                return Err(invalid(format!(
                    "{field}command_is_pid1: the container joins the sandbox's PID namespace \
                     (share_process_namespace), where its command cannot be PID 1"
                )));
            }
            check_shared_in_image(&field, &container.shared, &root.rootfs, &resolved.image)?;
            plan.containers.push(resolved);
            plan.roots.push(root);
            plan.images.push(image);
        }
        Ok(plan)
    }

    /// Resolves one container's request; `place` names it in errors (`containers[0] (db).`,
    /// or nothing for the request that adds it to a running sandbox).
    fn plan_one(
        &self,
        place: &str,
        request: &ContainerRequest,
        owner: &Owner,
        leases: &mut Vec<oci::ImageLease>,
    ) -> Result<
        (
            ContainerPlan,
            namespace::ContainerRoot,
            Option<oci::ImageRecord>,
        ),
        CreateError,
    > {
        let field = |name: &str| format!("{place}{name}");
        let image = request
            .image
            .clone()
            .unwrap_or_else(|| DEFAULT_IMAGE.to_string());
        let imported = self
            .lease_image(&image, owner)
            .map_err(|e| prefix(e, &field("")))?;
        let record = imported.as_ref().map(|(r, _)| r);
        let accounts = self.accounts(record)?;
        let mut defaults =
            crate::state::sandbox_defaults(record, request.user.as_deref(), &accounts)
                .map_err(|e| prefix(e, &field("")))?;
        if let Some(cwd) = &request.cwd {
            if !cwd.starts_with('/') || cwd.contains('\0') {
                return Err(CreateError::Invalid(format!(
                    "{}: must be an absolute path without NUL, got {cwd:?}",
                    field("cwd")
                )));
            }
            let mut with_cwd = defaults.as_deref().cloned().unwrap_or_default();
            with_cwd.working_dir = Some(cwd.clone());
            defaults = Some(Arc::new(with_cwd));
        }
        crate::state::check_env(&request.env, &field("env"))?;
        let main = container_command(request, record.map(|r| &r.run_config), &field("command"))?;
        if let Some(check) = &request.ready {
            check_ready(check, &field("ready"))?;
        }
        let rootfs = match &imported {
            Some((record, _)) => self.storage()?.images.root_dir(record),
            None => ImagePaths::in_dir(&self.config.image_dir).rootfs,
        };
        let record = imported.map(|(record, lease)| {
            leases.push(lease);
            record
        });
        // The daemon may have been started with a relative image directory.
        let rootfs = std::path::absolute(&rootfs).map_err(|e| {
            CreateError::Invalid(format!(
                "{}: the image's tree {}: {e}",
                field("image"),
                rootfs.display()
            ))
        })?;
        if request.command_is_pid1 && request.restart != api_types::RestartPolicy::No {
            return Err(CreateError::Invalid(format!(
                "{}: a container whose command is PID 1 of its PID namespace cannot be \
                 restarted (the namespace ends with it): leave restart at \"no\"",
                field("command_is_pid1")
            )));
        }
        let root = namespace::ContainerRoot {
            name: request.name.clone(),
            rootfs,
            share_pids: request.share_process_namespace,
            command_is_pid1: request.command_is_pid1,
            security: security_settings(&request.security)
                .map_err(|why| CreateError::Invalid(format!("{}.{why}", field("security"))))?,
        };
        root.check()
            .map_err(|e| CreateError::Invalid(format!("{}: {e}", field("image"))))?;
        Ok((
            ContainerPlan {
                name: request.name.clone(),
                image,
                env: request.env.clone(),
                defaults,
                accounts,
                main,
                restart: request.restart,
                ready: request.ready.clone(),
                depends_on: request.depends_on.clone(),
            },
            root,
            record,
        ))
    }
}

/// What a container runs: the image's entrypoint and command, or the request's own (Docker's
/// rule: an entrypoint of the request's own drops the image's `Cmd` too).
fn container_command(
    request: &ContainerRequest,
    config: Option<&oci::manifest::RunConfig>,
    field: &str,
) -> Result<Vec<String>, CreateError> {
    let entrypoint = match &request.entrypoint {
        Some(own) => own.clone(),
        None => config
            .and_then(|c| c.entrypoint.clone())
            .unwrap_or_default(),
    };
    let command = match (&request.command, &request.entrypoint) {
        (Some(own), _) => own.clone(),
        (None, Some(_)) => Vec::new(),
        (None, None) => config.and_then(|c| c.cmd.clone()).unwrap_or_default(),
    };
    let main: Vec<String> = entrypoint.into_iter().chain(command).collect();
    if main.iter().any(|a| a.contains('\0')) {
        return Err(CreateError::Invalid(format!(
            "{field}: arguments may not contain NUL"
        )));
    }
    Ok(main)
}

/// A container's readiness check: exactly one of a TCP port and a command, within an hour.
fn check_ready(check: &api_types::ReadyCheck, field: &str) -> Result<(), CreateError> {
    match (&check.tcp_port, &check.command) {
        (Some(0), _) => {
            return Err(CreateError::Invalid(format!(
                "{field}: tcp_port must be 1 to 65535"
            )))
        }
        (Some(_), None) => {}
        (None, Some(command)) if !command.is_empty() => {}
        _ => {
            return Err(CreateError::Invalid(format!(
                "{field}: give exactly one of tcp_port and a non-empty command"
            )))
        }
    }
    if check.timeout_s == Some(0) || check.timeout_s.is_some_and(|t| t > 3600) {
        return Err(CreateError::Invalid(format!(
            "{field}: timeout_s must be 1 to 3600"
        )));
    }
    Ok(())
}

/// `error` with `field` in front of its message, for an error about one container.
fn prefix(error: CreateError, field: &str) -> CreateError {
    match error {
        CreateError::Invalid(why) if !field.is_empty() => {
            CreateError::Invalid(format!("{field} {why}"))
        }
        other => other,
    }
}

/// Every shared mount of the request, checked: names, paths, and no two mounts of one root
/// where one would hide the other (the sandbox's own caches and volumes included).
fn shared_mounts(request: &CreateSandbox) -> Result<Vec<namespace::SharedMount>, CreateError> {
    let mut mounts = Vec::new();
    let mut add = |owner: &str, what: &str, shared: &[api_types::SharedMount]| {
        let mut targets: Vec<(String, &str)> = Vec::new();
        if owner == MAIN_CONTAINER {
            targets.extend(
                request
                    .caches
                    .iter()
                    .map(|c| (format!("caches ({})", c.name), c.path.as_str())),
            );
            targets.extend(
                request
                    .volumes
                    .iter()
                    .map(|v| (format!("volumes ({})", v.name), v.path.as_str())),
            );
        }
        mounts.extend(check_shared(owner, what, shared, targets)?);
        Ok::<(), CreateError>(())
    };
    add(MAIN_CONTAINER, "", &request.shared)?;
    for (i, container) in request.containers.iter().enumerate() {
        let what = format!("containers[{i}] ({}).", container.name);
        add(&container.name, &what, &container.shared)?;
    }
    Ok(mounts)
}

/// Refuses a shared mount of `shared` (`what` names their place in the request) whose path
/// passes a symlink or a file of the image tree `root` (image `image`): a namespace sandbox
/// builds its mount points without following links, so it would fail the sandbox's start,
/// and in a microVM's container a link would be resolved from the guest's root, not the
/// container's.
fn check_shared_in_image(
    what: &str,
    shared: &[api_types::SharedMount],
    root: &Path,
    image: &str,
) -> Result<(), CreateError> {
    for (j, mount) in shared.iter().enumerate() {
        let field = format!("{what}shared[{j}] ({})", mount.name);
        check_in_image(root, image, &field, mount.path.trim_end_matches('/'))?;
    }
    Ok(())
}

/// The shared mounts `owner` asks for (`what` names its place in the request), checked with
/// the other mount `targets` of its root: names, paths, none hiding another.
fn check_shared<'a>(
    owner: &str,
    what: &str,
    shared: &'a [api_types::SharedMount],
    mut targets: Vec<(String, &'a str)>,
) -> Result<Vec<namespace::SharedMount>, CreateError> {
    for (j, mount) in shared.iter().enumerate() {
        namespace::pod::check_name(&mount.name, "name")
            .map_err(|e| CreateError::Invalid(format!("{what}shared[{j}].{e}")))?;
        targets.push((format!("{what}shared[{j}] ({})", mount.name), &mount.path));
    }
    validate_targets(&targets)?;
    Ok(shared
        .iter()
        .map(|mount| namespace::SharedMount {
            owner: owner.to_string(),
            dir: mount.name.clone(),
            target: mount.path.trim_end_matches('/').into(),
            read_only: mount.read_only,
        })
        .collect())
}

impl Engine {
    /// Adds the container `request` asks for to the running sandbox `sandbox` (a namespace
    /// sandbox, or a microVM created with `container_slots`), as it would have been made with
    /// it: its image leased for the sandbox's
    /// owner, its `depends_on` naming containers the sandbox runs; returns its view once it
    /// is ready.
    pub async fn add_container(
        &self,
        sandbox: &Arc<Sandbox>,
        request: &ContainerRequest,
    ) -> Result<api_types::ContainerInfo, AddContainerError> {
        let invalid = |e: CreateError| match e {
            CreateError::Invalid(why) => AddContainerError::Invalid(why),
            CreateError::Storage(e) => AddContainerError::Storage(e),
            other => AddContainerError::Invalid(report::chain(&other)),
        };
        let kind = sandbox.backend();
        let caps = self.capabilities(kind);
        if !caps.containers {
            return Err(AddContainerError::Invalid(format!(
                "containers: the {kind} backend runs no containers (sandbox {})",
                sandbox.id
            )));
        }
        namespace::pod::check_name(&request.name, "name").map_err(AddContainerError::Invalid)?;
        super::request_bounds::check_container(request).map_err(AddContainerError::Invalid)?;
        if request.name == MAIN_CONTAINER {
            return Err(AddContainerError::Invalid(format!(
                "name: {MAIN_CONTAINER:?} is the sandbox's own root"
            )));
        }
        for dependency in &request.depends_on {
            if dependency == &request.name || sandbox.container(dependency).is_none() {
                return Err(AddContainerError::Invalid(format!(
                    "depends_on: {dependency:?} is not another container of sandbox {}",
                    sandbox.id
                )));
            }
        }
        let shared =
            check_shared(&request.name, "", &request.shared, Vec::new()).map_err(invalid)?;
        let mut leases = Vec::new();
        let (plan, root, record) = self
            .plan_one("", request, sandbox.owner(), &mut leases)
            .map_err(invalid)?;
        check_shared_in_image("", &request.shared, &root.rootfs, &plan.image).map_err(invalid)?;
        refuse_security_on(kind, caps, &root, "", true).map_err(invalid)?;
        let host_paths =
            host_paths(kind, caps, &request.host_paths).map_err(AddContainerError::Invalid)?;
        // A microVM reaches the image as a read-only ext4 snapshot, as at creation.
        let disk = match caps.disks_fixed_at_boot {
            true => {
                let images = &self.storage()?.images;
                Some(match &record {
                    Some(record) => images.root_disk(record).await?,
                    None => images.tree_disk(&root.rootfs).await?,
                })
            }
            false => None,
        };
        let shared: Vec<wire::agent::SharedDir> = shared
            .into_iter()
            .map(|mount| wire::agent::SharedDir {
                name: mount.dir,
                path: mount.target.to_string_lossy().into_owned(),
                read_only: mount.read_only,
            })
            .collect();
        // From here on it holds what a restarted daemon could not take back.
        self.registry.forget_record(&sandbox.id);
        let root = namespace::ContainerRoot {
            share_pids: root.share_pids || sandbox.shares_process_namespace(),
            ..root
        };
        let container = sandbox
            .add_container(
                plan,
                &root,
                disk.as_deref(),
                &shared,
                &host_paths,
                leases.pop(),
            )
            .await?;
        Ok(container.info())
    }
}

/// A container's host paths as the backend mounts them, or why not: a namespace sandbox's
/// alone, at most [`namespace::MAX_HOST_PATHS`], each source an absolute host directory
/// (found now, so that a missing one is a `400`), each target a plain path outside `/proc`,
/// `/dev` and `/sys`, no target twice.
fn host_paths(
    kind: api_types::BackendKind,
    caps: Capabilities,
    requested: &[api_types::HostPath],
) -> Result<Vec<namespace::HostPathMount>, String> {
    if requested.is_empty() {
        return Ok(Vec::new());
    }
    if !caps.host_paths {
        return Err(format!(
            "host_paths: the {kind} backend mounts no host path (a microVM's kernel is not the \
             host's)"
        ));
    }
    if requested.len() > namespace::MAX_HOST_PATHS {
        return Err(format!(
            "host_paths: {} asked for, at most {}",
            requested.len(),
            namespace::MAX_HOST_PATHS
        ));
    }
    let mut targets = BTreeSet::new();
    requested
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let field = format!("host_paths[{i}]");
            if !host.source.starts_with('/') || host.source.contains('\0') {
                return Err(format!(
                    "{field}.source: {:?} is not an absolute path",
                    host.source
                ));
            }
            match std::fs::metadata(&host.source) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(format!(
                        "{field}.source: {} is not a directory",
                        host.source
                    ))
                }
                Err(e) => return Err(format!("{field}.source: {}: {e}", host.source)),
            }
            namespace::check_host_path_target(&host.path)
                .map_err(|why| format!("{field}.path: {why}"))?;
            if !targets.insert(host.path.as_str()) {
                return Err(format!("{field}.path: {:?} is asked for twice", host.path));
            }
            Ok(namespace::HostPathMount {
                source: host.source.clone().into(),
                target: host.path.clone(),
                read_only: host.read_only,
                propagation: match host.propagation {
                    api_types::HostPathPropagation::Private => namespace::Propagation::Private,
                    api_types::HostPathPropagation::HostToContainer => {
                        namespace::Propagation::FromHost
                    }
                },
            })
        })
        .collect()
}

/// A container's security settings as the backend applies them: capability names as a mask.
fn security_settings(
    request: &api_types::ContainerSecurity,
) -> Result<contract::container_security::ContainerSecurity, String> {
    let capabilities = request
        .capabilities
        .as_ref()
        .map(|names| {
            contract::container_security::capability_mask(names.iter().map(String::as_str))
                .map_err(|why| format!("capabilities: {why}"))
        })
        .transpose()?;
    let paths = |paths: &[String], field: &str| {
        contract::container_security::check_paths(paths)
            .map(|()| paths.to_vec())
            .map_err(|why| format!("{field}: {why}"))
    };
    Ok(contract::container_security::ContainerSecurity {
        read_only_root: request.read_only_root,
        no_new_privileges: request.no_new_privileges,
        capabilities,
        masked_paths: paths(&request.masked_paths, "masked_paths")?,
        read_only_paths: paths(&request.read_only_paths, "read_only_paths")?,
        writable_files: paths(&request.writable_files, "writable_files")?,
        seccomp_filter: match &request.seccomp {
            Some(profile) => seccomp_filter(profile).map_err(|why| format!("seccomp: {why}"))?,
            None => Vec::new(),
        },
    })
}

/// A container's seccomp profile compiled to the filter its container installs, or why it
/// cannot be, naming the rule.
fn seccomp_filter(profile: &api_types::SeccompProfile) -> Result<Vec<u64>, String> {
    use namespace::seccomp_profile::{compile, Action, ArgCheck, Op, Profile, Rule};
    let default_action = Action::parse(&profile.default_action, profile.default_errno_ret)
        .map_err(|why| format!("default_action: {why}"))?;
    let rules = profile
        .syscalls
        .iter()
        .enumerate()
        .map(|(i, rule)| {
            let field = |why: String| format!("syscalls[{i}]: {why}");
            let action =
                Action::parse(&rule.action, rule.errno_ret).map_err(|e| field(e.to_string()))?;
            let args = rule
                .args
                .iter()
                .map(|arg| {
                    Ok(ArgCheck {
                        index: arg.index,
                        value: arg.value,
                        value_two: arg.value_two,
                        op: Op::parse(&arg.op).map_err(|e| field(e.to_string()))?,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok(Rule {
                names: rule.names.clone(),
                action,
                args,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    compile(&Profile {
        default_action,
        rules,
    })
    .map_err(|why| why.to_string())
}

/// Refuses security settings on a backend that cannot apply them (a microVM's containers run
/// as the guest's root, whose capabilities and mounts are the guest kernel's), naming the
/// container by `field` (`containers[N].` or nothing).
/// `added` says whether the container is added to a running sandbox, where a microVM's
/// container takes a seccomp profile (its guest agent installs it); one made with the
/// sandbox does not (its command line is the guest kernel's, too small for a filter).
pub(crate) fn refuse_security_on(
    kind: api_types::BackendKind,
    caps: Capabilities,
    root: &namespace::ContainerRoot,
    field: &str,
    added: bool,
) -> Result<(), CreateError> {
    if root.command_is_pid1 && !caps.container_pid1 {
        return Err(CreateError::Invalid(format!(
            "{field}command_is_pid1: the {kind} backend keeps a container's agent as its PID 1; \
             the namespace backend makes its command PID 1"
        )));
    }
    let takes_it = match caps.container_security {
        ContainerSecurity::All => true,
        ContainerSecurity::SeccompWhenAdded => added && root.security.is_only_seccomp(),
        ContainerSecurity::None => false,
    };
    if takes_it || root.security.is_default() {
        return Ok(());
    }
    let takes = match added {
        true => "a seccomp profile alone",
        false => "none at creation (a seccomp profile when the container is added later)",
    };
    Err(CreateError::Invalid(format!(
        "{field}security: the {kind} backend applies no container security settings \
         (read_only_root, no_new_privileges, capabilities, masked_paths, read_only_paths, \
         writable_files) but {takes}; a namespace sandbox applies them all"
    )))
}

/// Refuses `depends_on` that go round in a circle, naming it.
fn check_no_cycle(containers: &[ContainerRequest]) -> Result<(), CreateError> {
    // Kahn's order: what is left once nothing more can start is a cycle (or waits on one).
    let mut started: BTreeSet<&str> = BTreeSet::new();
    loop {
        let next: Vec<&str> = containers
            .iter()
            .filter(|c| !started.contains(c.name.as_str()))
            .filter(|c| c.depends_on.iter().all(|d| started.contains(d.as_str())))
            .map(|c| c.name.as_str())
            .collect();
        if next.is_empty() {
            break;
        }
        started.extend(next);
    }
    let stuck: Vec<&str> = containers
        .iter()
        .map(|c| c.name.as_str())
        .filter(|name| !started.contains(name))
        .collect();
    if stuck.is_empty() {
        Ok(())
    } else {
        Err(CreateError::Invalid(format!(
            "containers: depends_on goes round in a circle among {}",
            stuck.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(name: &str, depends_on: &[&str]) -> ContainerRequest {
        ContainerRequest {
            name: name.into(),
            depends_on: depends_on.iter().map(|d| d.to_string()).collect(),
            ..ContainerRequest::default()
        }
    }

    #[test]
    fn a_circle_of_dependencies_is_refused_and_named() {
        let fine = [
            container("db", &[]),
            container("web", &["db"]),
            container("job", &["web", "db"]),
        ];
        check_no_cycle(&fine).expect("a chain");
        let circle = [
            container("db", &[]),
            container("a", &["b"]),
            container("b", &["a"]),
            container("c", &["b"]),
        ];
        let e = check_no_cycle(&circle).expect_err("circle").to_string();
        assert!(e.contains("a, b, c"), "{e}");
        assert!(!e.contains("db"), "{e}");
    }

    #[test]
    fn shared_mounts_are_checked_per_root() {
        let request = CreateSandbox {
            shared: vec![api_types::SharedMount {
                name: "work".into(),
                path: "/work/".into(),
                read_only: false,
            }],
            containers: vec![ContainerRequest {
                name: "db".into(),
                shared: vec![api_types::SharedMount {
                    name: "work".into(),
                    path: "/work".into(),
                    read_only: false,
                }],
                ..ContainerRequest::default()
            }],
            ..CreateSandbox::default()
        };
        let mounts = shared_mounts(&request).expect("fine");
        assert_eq!(
            mounts.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
            ["main:work:/work", "db:work:/work"]
        );
        let mut hiding = request.clone();
        hiding.containers[0].shared.push(api_types::SharedMount {
            name: "other".into(),
            path: "/work/sub".into(),
            read_only: false,
        });
        let e = shared_mounts(&hiding).expect_err("overlap");
        assert!(e.to_string().contains("overlap"), "{e}");
        let mut bad_name = request;
        bad_name.shared[0].name = "Work".into();
        let e = shared_mounts(&bad_name).expect_err("name");
        assert!(e.to_string().starts_with("shared[0].name"), "{e}");
    }
}
