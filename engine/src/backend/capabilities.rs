//! What a backend can give a sandbox. The create steps ask a backend's capabilities, never its
//! kind, so a new backend declares what it does in its own file and the steps follow; its
//! kind only names it in messages.

/// Which of a container's security settings a backend applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerSecurity {
    /// Every one: `read_only_root`, `no_new_privileges`, capabilities, masked and read-only
    /// paths, writable files, seccomp.
    All,
    /// A seccomp profile alone, and only for a container added to a running sandbox (one made
    /// with the sandbox has no room for a filter).
    SeccompWhenAdded,
    /// None.
    None,
}

/// What a backend can give a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Runs containers beside the sandbox's own root.
    pub containers: bool,
    /// Makes a container's command its PID 1 (`command_is_pid1`).
    pub container_pid1: bool,
    /// Which container security settings it applies.
    pub container_security: ContainerSecurity,
    /// Mounts host paths into a container (`host_paths`): only a kernel shared with the host.
    pub host_paths: bool,
    /// Caches, volumes and a disk-backed writable layer.
    pub storage: bool,
    /// A root from an imported image.
    pub imported_images: bool,
    /// Network through the egress proxy (`network.allow`).
    pub egress: bool,
    /// Namespaced kernel settings (`sysctls`).
    pub sysctls: bool,
    /// Joins a host network namespace (`network_namespace`: `host` or a path).
    pub host_network_namespace: bool,
    /// Takes a pod's network namespace by carrying its connections through the egress proxy
    /// (a VM has no network device to link there).
    pub pod_network_through_proxy: bool,
    /// Its disks are fixed at boot: every root, image and volume reaches it as a block device
    /// (an ext4 image), and a container added later needs a slot asked for at creation.
    pub disks_fixed_at_boot: bool,
    /// Makes mount points inside the image's own tree, so each is checked against it first.
    pub mounts_in_image_tree: bool,
    /// Takes back the sandboxes an earlier daemon left running (live restore).
    pub restore: bool,
}

impl Capabilities {
    /// A backend that runs a command and nothing more (the base a new backend starts from).
    pub const NONE: Capabilities = Capabilities {
        containers: false,
        container_pid1: false,
        container_security: ContainerSecurity::None,
        host_paths: false,
        storage: false,
        imported_images: false,
        egress: false,
        sysctls: false,
        host_network_namespace: false,
        pod_network_through_proxy: false,
        disks_fixed_at_boot: false,
        mounts_in_image_tree: false,
        restore: false,
    };
}
