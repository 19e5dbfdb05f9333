//! crucible's image store. Images arrive as one tar stream: an OCI image layout (a directory
//! tarred, or an OCI archive), a `docker save` archive, or a plain rootfs tarball (gzip or not).
//! Their layer blobs are stored by digest (a layer two images share is stored once), and each
//! distinct layer chain is unpacked once into a root tree the sandboxes use read-only.
//!
//! Everything here treats its input as hostile: paths never leave the tree being written
//! ([`unpack`]), sizes and entry counts are bounded, device nodes are dropped.

#![forbid(unsafe_code)]

pub mod archive;
pub mod compression;
pub mod defaults;
pub mod digest;
pub mod manifest;
pub mod source;
pub mod store;
pub mod unpack;
pub mod write;

pub use digest::Digest;
pub use store::{ImageLease, ImageRecord, Store, StoreError};
