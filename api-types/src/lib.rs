//! The JSON types of crucible's REST API (`/sandboxes`, `/caches`, `/images`): what the daemon
//! answers and its clients send. The guest never compiles them: the agent protocol and the
//! exec stream's types are `wire`'s. With the `schema` feature each derives its JSON Schema,
//! from which the daemon's OpenAPI document is made.

#![forbid(unsafe_code)]

mod container;
mod image;
mod sandbox;

pub use container::{
    ContainerInfo, ContainerList, ContainerRequest, ContainerSecurity, ContainerState, HostPath,
    HostPathPropagation, ReadyCheck, RestartPolicy, SeccompArg, SeccompProfile, SeccompRule,
    SharedMount,
};
pub use image::{ImageInfo, ImageList, ImageUser, ImagesPruned};
pub use sandbox::{
    BackendKind, CacheInfo, CacheList, CacheMount, CreateSandbox, EgressRefusal, Hypervisor,
    NetworkInfo, NetworkRequest, SandboxInfo, SandboxList, SandboxState, SandboxTimings,
    SignalRequest, UpdateSandbox, VolumeMount, HOST_NETWORK_NAMESPACE,
};
