//! The OpenAPI document, generated from the wire types' JSON Schemas plus the route table
//! below. Served at `GET /openapi.json` and written to `docs/openapi.json` by
//! `cargo xtask gen-openapi` (CI fails when that file drifts from this code).

use api_types::{
    CacheList, ContainerInfo, ContainerList, ContainerRequest, CreateSandbox, ImageList,
    ImagesPruned, SandboxInfo, SandboxList, SignalRequest, UpdateSandbox,
};
use schemars::generate::SchemaSettings;
use serde_json::{json, Map, Value};
use wire::{
    ErrorBody, ExecList, ExecRequest, ExecResult, ExecStatus, FilesPutResult, SandboxStats,
};

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn json_response(description: &str, schema: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": schema_ref(schema) } }
    })
}

fn error(description: &str) -> Value {
    json_response(description, "ErrorBody")
}

fn errors(codes: &[(&str, &str)]) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("401".into(), error("Missing or invalid API key."));
    for (code, description) in codes {
        map.insert((*code).into(), error(description));
    }
    map
}

fn with(mut base: Map<String, Value>, extra: Value) -> Value {
    if let Value::Object(extra) = extra {
        base.extend(extra);
    }
    Value::Object(base)
}

fn id_param() -> Value {
    json!({
        "name": "id", "in": "path", "required": true,
        "description": "The sandbox id.",
        "schema": { "type": "string", "pattern": "^sb-[0-9a-f]{16}$" }
    })
}

fn exec_id_param() -> Value {
    json!({
        "name": "exec_id", "in": "path", "required": true,
        "description": "The command's exec_id (its request's, or the one the daemon gave it in X-Crucible-Exec-Id).",
        "schema": { "type": "string", "pattern": "^[A-Za-z0-9._-]{1,128}$" }
    })
}

fn container_param() -> Value {
    json!({
        "name": "container", "in": "query", "required": false,
        "description": "One of the sandbox's containers, by name (see CreateSandbox.containers); absent or `main`: the sandbox's own root.",
        "schema": { "type": "string", "pattern": "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$" }
    })
}

fn container_name_param() -> Value {
    json!({
        "name": "name", "in": "path", "required": true,
        "description": "The container's name.",
        "schema": { "type": "string", "pattern": "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$" }
    })
}

fn path_query(description: &str) -> Value {
    json!({
        "name": "path", "in": "query", "required": true, "description": description,
        "schema": { "type": "string", "pattern": "^/" }
    })
}

/// Sets a property's keywords in a schema of `schemas` (a no-op if the property is missing).
fn set(schemas: &mut Map<String, Value>, schema: &str, property: &str, keywords: Value) {
    let target = schemas
        .get_mut(schema)
        .and_then(|s| s.get_mut("properties"))
        .and_then(|p| p.get_mut(property))
        .and_then(Value::as_object_mut);
    if let (Some(target), Value::Object(keywords)) = (target, keywords) {
        target.extend(keywords);
    }
}

/// The validation rules the daemon applies that the derived schemas cannot know: the default
/// limits (a daemon may be configured otherwise), the one image, no NUL in what becomes a C
/// string. Rules OpenAPI 3.0 cannot state (`cmd[0]` non-empty, env names without `=` or NUL)
/// are in the descriptions.
fn constrain(schemas: &mut Map<String, Value>) {
    let limits = crate::config::Limits::default();
    let no_nul = "^[^\\u0000]*$";
    set(
        schemas,
        "CreateSandbox",
        "memory_mib",
        json!({ "minimum": 16, "maximum": limits.max_memory_mib }),
    );
    set(
        schemas,
        "CreateSandbox",
        "vcpus",
        json!({ "minimum": 1, "maximum": limits.max_vcpus }),
    );
    for (field, bounds) in [
        (
            "memory_mib",
            json!({ "minimum": 16, "maximum": limits.max_memory_mib }),
        ),
        (
            "vcpus",
            json!({ "minimum": 1, "maximum": limits.max_vcpus }),
        ),
    ] {
        set(schemas, "UpdateSandbox", field, bounds);
    }
    set(
        schemas,
        "CreateSandbox",
        "ttl_s",
        json!({ "minimum": 1, "maximum": limits.max_ttl_s }),
    );
    set(
        schemas,
        "CreateSandbox",
        "image",
        json!({ "pattern": IMAGE_NAME_PATTERN, "maxLength": 128 }),
    );
    set(
        schemas,
        "CreateSandbox",
        "env",
        json!({ "additionalProperties": { "type": "string", "pattern": no_nul } }),
    );
    set(
        schemas,
        "CreateSandbox",
        "disk_mib",
        json!({ "minimum": engine::state::MIN_DISK_MIB }),
    );
    set(
        schemas,
        "CacheMount",
        "name",
        json!({ "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$" }),
    );
    set(schemas, "CacheMount", "size_mib", json!({ "minimum": 1 }));
    for schema in ["CacheMount", "VolumeMount"] {
        set(
            schemas,
            schema,
            "path",
            json!({ "pattern": "^/[^:\\u0000-\\u001f]*$", "maxLength": 4096 }),
        );
    }
    for field in ["masked_paths", "read_only_paths", "writable_files"] {
        // `.` and `..` components are refused too (400), which a pattern cannot say simply.
        set(
            schemas,
            "ContainerSecurity",
            field,
            json!({
                "maxItems": contract::container_security::MAX_PATHS,
                "items": {
                    "type": "string",
                    "pattern": "^(/[A-Za-z0-9._,@:-]+)+$",
                    "maxLength": contract::container_security::MAX_PATH_BYTES,
                },
            }),
        );
    }
    set(
        schemas,
        "ContainerRequest",
        "host_paths",
        json!({ "maxItems": contract::container_security::MAX_HOST_PATHS }),
    );
    set(
        schemas,
        "HostPath",
        "path",
        json!({
            "pattern": "^(/[A-Za-z0-9._,@:-]+)+$",
            "maxLength": contract::container_security::MAX_PATH_BYTES,
        }),
    );
    set(
        schemas,
        "HostPath",
        "source",
        json!({ "pattern": "^/[^\\u0000]*$", "maxLength": 4096 }),
    );
    {
        use contract::container_security as bounds;
        let actions = [
            "SCMP_ACT_ALLOW",
            "SCMP_ACT_ERRNO",
            "SCMP_ACT_KILL",
            "SCMP_ACT_KILL_THREAD",
            "SCMP_ACT_KILL_PROCESS",
            "SCMP_ACT_TRAP",
            "SCMP_ACT_TRACE",
        ];
        let errno = json!({ "maximum": bounds::SECCOMP_MAX_ERRNO });
        set(
            schemas,
            "SeccompProfile",
            "default_action",
            json!({ "enum": actions }),
        );
        set(
            schemas,
            "SeccompProfile",
            "default_errno_ret",
            errno.clone(),
        );
        set(
            schemas,
            "SeccompProfile",
            "syscalls",
            json!({ "maxItems": bounds::SECCOMP_MAX_RULES }),
        );
        set(schemas, "SeccompRule", "action", json!({ "enum": actions }));
        set(schemas, "SeccompRule", "errno_ret", errno);
        set(
            schemas,
            "SeccompRule",
            "names",
            json!({
                "maxItems": bounds::SECCOMP_MAX_NAMES,
                "items": { "type": "string", "maxLength": 64 },
            }),
        );
        set(
            schemas,
            "SeccompRule",
            "args",
            json!({ "maxItems": bounds::SECCOMP_MAX_ARGS }),
        );
        set(schemas, "SeccompArg", "index", json!({ "maximum": 5 }));
        set(
            schemas,
            "SeccompArg",
            "op",
            json!({ "enum": ["SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_EQ",
                             "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_MASKED_EQ"] }),
        );
    }
    set(
        schemas,
        "ExecRequest",
        "cmd",
        json!({ "items": { "type": "string", "pattern": no_nul } }),
    );
    set(
        schemas,
        "ExecRequest",
        "env",
        json!({ "additionalProperties": { "type": "string", "pattern": no_nul } }),
    );
    set(
        schemas,
        "ExecRequest",
        "cwd",
        json!({ "pattern": "^(/[^\\u0000]*)?$" }),
    );
}

/// An image name: `default` (built in) or one imported (`oci::store::validate_name`; names
/// with `/` are accepted too, but a path parameter cannot say so).
const IMAGE_NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$";

/// The whole document.
pub(crate) fn document() -> Value {
    let mut generator = SchemaSettings::openapi3().into_generator();
    generator.subschema_for::<CreateSandbox>();
    generator.subschema_for::<SandboxInfo>();
    generator.subschema_for::<SandboxList>();
    generator.subschema_for::<ExecRequest>();
    generator.subschema_for::<ExecResult>();
    generator.subschema_for::<FilesPutResult>();
    generator.subschema_for::<ErrorBody>();
    generator.subschema_for::<CacheList>();
    generator.subschema_for::<ImageList>();
    generator.subschema_for::<ImagesPruned>();
    generator.subschema_for::<SandboxStats>();
    generator.subschema_for::<SignalRequest>();
    generator.subschema_for::<UpdateSandbox>();
    generator.subschema_for::<ExecStatus>();
    generator.subschema_for::<ExecList>();
    generator.subschema_for::<ContainerList>();
    generator.subschema_for::<ContainerRequest>();
    generator.subschema_for::<ContainerInfo>();
    let mut schemas = generator.take_definitions(true);
    constrain(&mut schemas);

    let sandbox_errors = [
        ("400", "The id is malformed."),
        ("404", "No sandbox with this id, as far as the caller can see: another key's sandbox is answered exactly like a missing one."),
    ];
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "crucible",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Disposable Linux sandboxes for CI. Exec output is a length-prefixed \
                frame stream ([type:1][reserved:3][size:4 BE][payload]; 1 stdout, 2 stderr, \
                3 exit with an ExecResult payload, 4 stdin, 5 stdin_close, 6 resize with a \
                TerminalSize payload), specified in \
                docs/protocol.md. Every error has the JSON body ErrorBody."
        },
        "security": [{ "bearer": [] }],
        "paths": {
            "/healthz": { "get": {
                "summary": "Liveness; needs no key.",
                "security": [],
                "responses": { "200": { "description": "The daemon is up.",
                    "content": { "application/json": { "schema": { "type": "object" } } } } }
            }},
            "/metrics": { "get": {
                "summary": "Prometheus metrics.",
                "responses": with(errors(&[]), json!({ "200": { "description": "Prometheus text.",
                    "content": { "text/plain": { "schema": { "type": "string" } } } } }))
            }},
            "/openapi.json": { "get": {
                "summary": "This document.",
                "responses": with(errors(&[]), json!({ "200": { "description": "OpenAPI 3.0.",
                    "content": { "application/json": { "schema": { "type": "object" } } } } }))
            }},
            "/sandboxes": {
                "post": {
                    "summary": "Create a sandbox; answers once its agent is ready.",
                    "requestBody": { "required": false, "content": {
                        "application/json": { "schema": schema_ref("CreateSandbox") } } },
                    "responses": with(errors(&[
                        ("400", "The request is invalid (a field, an egress rule, a cache name or mount path, an undeclared volume, a container (its name, image, shared directories, or a depends_on that names no container or goes round in a circle), or a feature the backend lacks: a microVM takes at most six disks, its containers' images among them)."),
                        ("403", "network.allow asks for a host outside the operator's --egress-allow rules (code egress_not_allowed)."),
                        ("422", "A container did not become ready: its main process exited, or its ready check did not pass within its timeout (code container_not_ready; the message ends with its log's last lines). The sandbox is deleted."),
                        ("429", "The daemon runs its maximum number of sandboxes."),
                        ("500", "The sandbox could not be started."),
                        ("503", "The requested backend is not available on this host."),
                        ("507", "A new cache or disk-backed layer would take the daemon past its disk budget (code insufficient_storage)."),
                    ]), json!({ "201": json_response("The sandbox, running.", "SandboxInfo") }))
                },
                "get": {
                    "summary": "List the caller's sandboxes (all of them for the admin key and the Unix socket).",
                    "responses": with(errors(&[]),
                        json!({ "200": json_response("The sandboxes the caller may see.", "SandboxList") }))
                }
            },
            "/caches": {
                "get": {
                    "summary": "List the caller's named caches (every one for the admin key and the Unix socket).",
                    "responses": with(errors(&[]),
                        json!({ "200": json_response("The caches.", "CacheList") }))
                },
                "delete": {
                    "summary": "Delete every cache of the caller's that no sandbox uses.",
                    "responses": with(errors(&[]),
                        json!({ "200": json_response("The caches kept because they are in use.", "CacheList") }))
                }
            },
            "/caches/{name}": {
                "parameters": [{
                    "name": "name", "in": "path", "required": true,
                    "description": "The cache's name.",
                    "schema": { "type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$" }
                }],
                "delete": {
                    "summary": "Delete one of the caller's caches (on every backend).",
                    "responses": with(errors(&[
                        ("400", "The name is malformed."),
                        ("404", "The caller has no cache of this name."),
                        ("409", "A sandbox uses it."),
                    ]), json!({ "204": { "description": "Deleted." } }))
                }
            },
            "/sandboxes/{id}/signal": {
                "parameters": [id_param()],
                "post": {
                    "summary": "Send a signal to every process of the sandbox (or of one container, ?container=) but its agent, or to one running command.",
                    "parameters": [container_param()],
                    "description": "What `docker kill -s` and containerd's task kill need: the \
                        commands see it as they would from `kill`; the agent, PID 1, never \
                        does, and serves the next request. With `exec_id`, only the process \
                        group of the running command started with that `exec_id` gets it.",
                    "requestBody": {
                        "required": true,
                        "content": { "application/json": { "schema": schema_ref("SignalRequest") } }
                    },
                    "responses": with(errors(&[
                        ("400", "The id or the signal is invalid (1 to 64)."),
                        ("404", "No sandbox with this id, as far as the caller can see (code not_found), no such container (code container_not_found), or no running command with this exec_id (code exec_not_found)."),
                        ("409", "The sandbox is being deleted, or its agent cannot signal (code not_supported)."),
                        ("502", "The sandbox's agent could not be reached."),
                    ]), json!({ "204": { "description": "Sent." } }))
                }
            },
            "/sandboxes/{id}/execs": {
                "parameters": [id_param()],
                "get": {
                    "summary": "The sandbox's commands that can be found by exec_id: those that run, and those that ended while no client was attached and whose result has not been collected.",
                    "parameters": [container_param()],
                    "responses": with(errors(&[
                        ("400", "The id is malformed."),
                        ("404", "No sandbox with this id, as far as the caller can see."),
                        ("409", "The sandbox is not running."),
                        ("502", "The sandbox's agent could not be reached."),
                    ]), json!({ "200": json_response("The commands, oldest first.", "ExecList") }))
                }
            },
            "/sandboxes/{id}/execs/{exec_id}": {
                "parameters": [id_param(), exec_id_param()],
                "get": {
                    "summary": "One command's status (and its result, once it has ended).",
                    "parameters": [container_param()],
                    "responses": with(errors(&[
                        ("400", "The id or the exec_id is malformed."),
                        ("404", "No such sandbox, or no command with this exec_id (code exec_not_found: it never ran, it ended while attached, or its result was collected)."),
                        ("409", "The sandbox is not running."),
                        ("502", "The sandbox's agent could not be reached."),
                    ]), json!({ "200": json_response("The command.", "ExecStatus") }))
                },
                "delete": {
                    "summary": "End a command (SIGKILL to its process group) and forget it, or forget an ended command's uncollected result.",
                    "parameters": [container_param()],
                    "description": "A running command's process group gets SIGKILL, as with \
                        POST …/signal and this exec_id, and the answer comes once it has \
                        ended (at most 10 s): its result is then kept for nobody, and a GET or \
                        an attach of this exec_id is a 404. A client attached to it gets its \
                        exit frame (signal SIGKILL) as it would for any kill.",
                    "responses": with(errors(&[
                        ("400", "The id or the exec_id is malformed."),
                        ("404", "No sandbox with this id, as far as the caller can see (code not_found), no such container (code container_not_found), or no command with this exec_id (code exec_not_found)."),
                        ("409", "The sandbox is not running, or the command has not ended 10 s after SIGKILL."),
                        ("502", "The sandbox's agent could not be reached."),
                    ]), json!({ "204": { "description": "Ended and forgotten." } }))
                }
            },
            "/sandboxes/{id}/execs/{exec_id}/attach": {
                "parameters": [id_param(), exec_id_param()],
                "post": {
                    "summary": "Re-attach to a command whose connection dropped: its frame stream from output byte ?offset=, then live, then its one exit frame.",
                    "description": "Output bytes are numbered in stream order across stdout and \
                        stderr (payload bytes only). The agent keeps each command's latest \
                        output (the daemon's --exec-tail-bytes, 1 MiB by default); what the \
                        client asks for but is no longer kept is counted in the exit frame's \
                        output_dropped_bytes. An ended command's result is collected by the \
                        attach that delivers it. Headers: X-Crucible-Exec-Id, \
                        X-Crucible-Output-Bytes (its output so far), \
                        X-Crucible-Output-Kept-From (the oldest byte kept); for an interactive \
                        command, X-Crucible-Stdin-Bytes (the stdin bytes it took: send on \
                        from there) and X-Crucible-Stdin-Closed. With ?stdin=1 (an \
                        interactive command that asked for on_disconnect: keep) the connection \
                        is hijacked after a bare `HTTP/1.1 200 OK` header block (or a 101 for \
                        `Connection: Upgrade` + `Upgrade: tcp`) and carries stdin frames in, \
                        as the exec that started it did.",
                    "parameters": [{
                        "name": "offset", "in": "query", "required": false,
                        "description": "The output bytes the client already has (default 0: everything still kept).",
                        "schema": { "type": "integer", "minimum": 0, "maximum": u64::MAX }
                    }, { "name": "stdin", "in": "query", "required": false,
                        "description": "1 (or true) to re-attach to an interactive command, its stdin carried on (hijacked; must be the connection's first request); 0, false or empty for its output only.",
                        "schema": { "type": "string", "enum": ["0", "1", "true", "false", ""] } },
                        container_param()],
                    "responses": with(errors(&[
                        ("400", "The id or exec_id is malformed, the offset is past the command's output, or an interactive attach (?stdin=1) is not its connection's first request and asks for no Upgrade: tcp."),
                        ("404", "No such sandbox, or no command with this exec_id (code exec_not_found)."),
                        ("409", "Another client is attached, the command dies with its connection (on_disconnect: kill, or an interactive one that did not ask to keep), or the sandbox is not running."),
                        ("429", "The sandbox runs its maximum number of commands."),
                        ("502", "The sandbox's agent could not be reached."),
                    ]), json!({
                        "200": { "description": "The frame stream.", "content": {
                            "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } },
                        "101": { "description": "Switched to the raw frame stream (?stdin=1 with Upgrade: tcp)." }
                    }))
                }
            },
            "/sandboxes/{id}/stats": {
                "parameters": [id_param()],
                "get": {
                    "summary": "What the sandbox uses now: memory, CPU time and processes (a namespace sandbox's cgroups; a microVM's own kernel), or one container's share (?container=).",
                    "parameters": [container_param()],
                    "description": "With ?container=NAME: what that container's processes use \
                        (their resident memory summed, a page two share counted twice; their \
                        CPU time, reaped descendants included; how many they are), with the \
                        sandbox's memory and process limits, which its containers share; \
                        max_usage_bytes, cache_bytes and oom_kills are kept for the whole \
                        sandbox only and are 0. The sandbox's own root (main) is the whole \
                        sandbox.",
                    "responses": with(errors(&[
                        ("400", "The id is malformed."),
                        ("404", "No sandbox with this id, as far as the caller can see, or no such container (code container_not_found)."),
                        ("409", "Its backend cannot report them, or its agent did not answer (code not_supported)."),
                    ]), json!({ "200": json_response("The sandbox's usage.", "SandboxStats") }))
                }
            },
            "/images": {
                "get": {
                    "summary": "The built-in image, then the caller's imported images (every owner's for the admin key and the Unix socket).",
                    "responses": with(errors(&[]),
                        json!({ "200": json_response("The images.", "ImageList") }))
                },
                "post": {
                    "summary": "Import an image: the request body is the archive.",
                    "description": "An OCI image layout (tarred) or OCI archive, a docker save \
                        archive, or a rootfs tarball; gzip or not. Layers are applied in order \
                        with whiteouts and opaque directories; device nodes are dropped; paths \
                        never leave the image. The caller's image of the same name is replaced \
                        (sandboxes using it keep the old one). See docs/oci-images.md.",
                    "parameters": [{
                        "name": "name", "in": "query", "required": true,
                        "description": "The image's name (not `default`).",
                        "schema": { "type": "string", "pattern": IMAGE_NAME_PATTERN }
                    }],
                    "requestBody": {
                        "required": true,
                        "content": { "application/x-tar": { "schema": { "type": "string", "format": "binary" } } }
                    },
                    "responses": with(errors(&[
                        ("400", "The name is invalid, or the archive is not a usable image (malformed, hostile, another platform, or empty; code invalid_image)."),
                        ("408", "The upload stalled."),
                        ("413", "The archive or its unpacked tree is over crucible serve --image-max-mib (code image_too_large)."),
                        ("507", "The import would take the daemon past its disk budget (code insufficient_storage)."),
                    ]), json!({ "201": json_response("The image, imported.", "ImageInfo") }))
                },
                "delete": {
                    "summary": "Prune: remove the caller's images that no sandbox uses, as docker image prune -a.",
                    "description": "Narrowed to images no sandbox has taken or released (and nobody \
                        imported) for `unused_for_s` seconds, and to names starting with \
                        `prefix`. Their layers and trees go where no other image has them. \
                        The containerd shim prunes its idle `containerd-` images this way.",
                    "parameters": [
                        {
                            "name": "unused_for_s", "in": "query", "required": false,
                            "description": "Only images idle this many seconds (default 0: any not in use).",
                            "schema": { "type": "integer", "minimum": 0, "maximum": 315360000, "format": "int64" }
                        },
                        {
                            "name": "prefix", "in": "query", "required": false,
                            "description": "Only images whose name starts with this (default: all).",
                            "schema": { "type": "string", "maxLength": 128 }
                        }
                    ],
                    "responses": with(errors(&[
                        ("400", "A query parameter is malformed, unknown or out of range (unused_for_s at most ten years, prefix at most 128 bytes)."),
                    ]), json!({ "200": json_response("What was removed.", "ImagesPruned") }))
                }
            },
            "/images/{name}": {
                "parameters": [{
                    "name": "name", "in": "path", "required": true,
                    "description": "The image's name.",
                    "schema": { "type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$" }
                }],
                "get": {
                    "summary": "One of the caller's images (or the built-in one).",
                    "responses": with(errors(&[
                        ("404", "The caller has no image of this name."),
                    ]), json!({ "200": json_response("The image.", "ImageInfo") }))
                },
                "delete": {
                    "summary": "Remove one of the caller's images; its layers and tree go when no other image has them.",
                    "responses": with(errors(&[
                        ("404", "The caller has no image of this name."),
                        ("409", "A sandbox uses it, or it is the built-in image."),
                    ]), json!({ "204": { "description": "Removed." } }))
                }
            },
            "/sandboxes/{id}": {
                "parameters": [id_param()],
                "get": {
                    "summary": "One sandbox.",
                    "responses": with(errors(&sandbox_errors),
                        json!({ "200": json_response("The sandbox.", "SandboxInfo") }))
                },
                "delete": {
                    "summary": "Delete a sandbox and everything it holds.",
                    "responses": with(errors(&sandbox_errors),
                        json!({ "204": { "description": "Deleted." } }))
                },
                "patch": {
                    "summary": "Change a running sandbox's memory and CPU limits.",
                    "description": "As `docker update --memory --cpus`: a field left out keeps \
                        its value; the bounds are a create request's. Namespace backend (its \
                        cgroups); a microVM's are fixed at boot (409). A restarted daemon \
                        does not take the sandbox back afterwards (live restore).",
                    "requestBody": { "required": true, "content": {
                        "application/json": { "schema": schema_ref("UpdateSandbox") } } },
                    "responses": with(errors(&[
                        ("400", "Bad JSON, a value out of its bounds, or a malformed id."),
                        ("404", "No sandbox with this id, as far as the caller can see."),
                        ("409", "The sandbox is not running, or its backend cannot change its limits."),
                        ("413", "The request body is too large."),
                    ]), json!({ "200": json_response("The sandbox, with its new limits.", "SandboxInfo") }))
                }
            },
            "/sandboxes/{id}/exec": {
                "parameters": [id_param()],
                "post": {
                    "summary": "Run a command; stream its output as frames.",
                    "description": "Without stdin: 200 with an application/octet-stream body of \
                        stdout/stderr frames and exactly one exit frame. With ?stdin=1 the \
                        connection is hijacked after a bare `HTTP/1.1 200 OK` header block (or \
                        a 101 when the client sends `Connection: Upgrade` + `Upgrade: tcp`) \
                        and carries frames both ways. Failures after the 200 end the stream \
                        with a synthesized exit frame (exit_code -1 and error). The response \
                        header X-Crucible-Exec-Id names the command (the request's exec_id, or \
                        one the daemon gave it). A one-shot command outlives its connection \
                        unless it asks for on_disconnect: kill; re-attach with POST \
                        /sandboxes/{id}/execs/{exec_id}/attach. An interactive one ends with \
                        its connection, unless it asks for on_disconnect: keep (then \
                        re-attach with ?stdin=1).",
                    "parameters": [{ "name": "stdin", "in": "query", "required": false,
                        "description": "1 (or true) for an interactive (hijacked) session; 0, false or empty for a one-shot exec.",
                        "schema": { "type": "string", "enum": ["0", "1", "true", "false", ""] } },
                        container_param()],
                    "requestBody": { "required": true, "content": {
                        "application/json": { "schema": schema_ref("ExecRequest") } } },
                    "responses": with(errors(&[
                        ("400", "Bad JSON, a request that fails validation, or a malformed id."),
                        ("404", "No sandbox with this id, as far as the caller can see: another key's sandbox is answered exactly like a missing one; or no such container (code container_not_found)."),
                        ("409", "The sandbox is not running."),
                        ("413", "The request body is too large."),
                        ("429", "The sandbox runs its maximum number of commands."),
                    ]), json!({
                        "200": { "description": "The frame stream.", "content": {
                            "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } },
                        "101": { "description": "Switched to the raw frame stream (Upgrade: tcp)." }
                    }))
                },
                "get": {
                    "summary": "Interactive exec over WebSocket.",
                    "parameters": [container_param()],
                    "description": "Upgrade to a WebSocket; the first message is the JSON \
                        ExecRequest (within 30 s); then binary message payloads in each \
                        direction, concatenated, are the frame stream. Close codes: 1008 \
                        invalid request, 1011 guest unreachable, 1000 after the exit frame.",
                    "responses": with(errors(&sandbox_errors), json!({
                        "101": { "description": "Switched to WebSocket." },
                        "426": error("A plain GET without the WebSocket upgrade handshake.")
                    }))
                }
            },
            "/sandboxes/{id}/containers": {
                "parameters": [id_param()],
                "get": {
                    "summary": "The sandbox's containers: each one's state, main process, restarts and last exit.",
                    "responses": with(errors(&sandbox_errors),
                        json!({ "200": json_response("The containers, in the order they were made.", "ContainerList") }))
                },
                "post": {
                    "summary": "Add a container to the running sandbox; answers once it is ready.",
                    "description": "The body is one entry of CreateSandbox.containers: the \
                        container joins the sandbox's network, IPC and limits, mounts the \
                        shared directories it names (made empty if no container had them \
                        yet), and starts its main process once what it depends_on (containers \
                        the sandbox runs) is ready. A namespace sandbox takes any number; a \
                        microVM takes as many at once as the container_slots it was created \
                        with (its disks are fixed at boot; a removed container's slot serves \
                        the next). A name that was removed may be used again: the new \
                        container gets a fresh writable layer.",
                    "requestBody": { "required": true, "content": {
                        "application/json": { "schema": schema_ref("ContainerRequest") } } },
                    "responses": with(errors(&[
                        ("400", "The id or the request is invalid (a field, its image, a shared directory, a depends_on naming no container of the sandbox, a host path that is no directory or on a microVM), or the sandbox runs no containers (the process backend)."),
                        ("403", "host_paths asked for by a caller other than the admin key or the daemon's Unix socket."),
                        ("404", "No sandbox with this id, as far as the caller can see, or no such imported image."),
                        ("409", "The sandbox already has a container of this name, it is not running, or it is a microVM whose container_slots are all in use."),
                        ("422", "The container did not become ready: its main process exited, or its ready check did not pass within its timeout (code container_not_ready; the message ends with its log's last lines). It stays (failed, or exited when its main process ended) with its log, until it is removed."),
                        ("500", "The container could not be made (the message says why: e.g. a process of the sandbox killed its container factory)."),
                    ]), json!({ "201": json_response("The container, ready.", "ContainerInfo") }))
                }
            },
            "/sandboxes/{id}/containers/{name}": {
                "parameters": [id_param(), container_name_param()],
                "delete": {
                    "summary": "Remove a container from its sandbox: its agent ends, and with it every process of the container.",
                    "description": "As kubectl removing a pod's container: the container's \
                        PID 1 ends, so the kernel kills everything in it, and its name answers \
                        404 (container_not_found) from then on; its main process is not \
                        started again whatever its restart policy. Its writable layer stays in \
                        the sandbox's scratch until the sandbox is deleted. The other \
                        containers and the sandbox's own root run on.",
                    "responses": with(errors(&[
                        ("400", "The id is malformed, or the name is `main`, the sandbox's own root (delete the sandbox instead)."),
                        ("404", "No sandbox with this id, as far as the caller can see, or no such container (code container_not_found)."),
                    ]), json!({ "204": { "description": "Removed." } }))
                }
            },
            "/sandboxes/{id}/containers/{name}/logs": {
                "parameters": [id_param(), container_name_param()],
                "get": {
                    "summary": "A container's log: the output of its main process (every run of it), as an exec frame stream.",
                    "description": "Stdout and stderr frames as the process wrote them, oldest \
                        first: the daemon keeps the latest 1 MiB. Once the container has \
                        exited for good, the stream ends with its last exit frame, whose \
                        output_dropped_bytes counts what the log no longer holds; while it \
                        runs, the stream ends without one.",
                    "responses": with(errors(&[
                        ("400", "The id is malformed."),
                        ("404", "No sandbox with this id, as far as the caller can see, or no such container (code container_not_found)."),
                    ]), json!({ "200": { "description": "The frame stream.", "content": {
                        "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } } }))
                }
            },
            "/sandboxes/{id}/files": {
                "parameters": [id_param()],
                "post": {
                    "summary": "Upload a tar archive, extracted beneath ?path=.",
                    "parameters": [path_query("The destination directory in the sandbox (absolute)."), container_param()],
                    "requestBody": { "required": true, "content": {
                        "application/x-tar": { "schema": { "type": "string", "format": "binary" } } } },
                    "responses": with(errors(&[
                        ("400", "Bad path, or an entry was refused (it would escape the destination, or is a device)."),
                        ("403", "Permission denied in the sandbox."),
                        ("404", "No sandbox with this id, as far as the caller can see: another key's sandbox is answered exactly like a missing one."),
                        ("409", "The sandbox is not running."),
                        ("502", "The sandbox's agent failed."),
                    ]), json!({ "200": json_response("What was written.", "FilesPutResult") }))
                },
                "get": {
                    "summary": "Download one file (?path=), or with `Accept: application/x-tar` a directory (or file) as a tar stream.",
                    "description": "With `Accept: application/x-tar` the answer is a tar archive of the path, chunked: a directory's entries named relative to it (the directory itself is `./`), a file's one entry named after it; modes, owners and times kept; symbolic links archived as links, never followed; sockets left out. An archive the sandbox cannot finish is cut short without its last chunk, so a client sees an incomplete transfer, never a shorter archive.",
                    "parameters": [path_query("The file or, with `Accept: application/x-tar`, the directory in the sandbox (absolute)."), container_param()],
                    "responses": with(errors(&[
                        ("400", "Bad path, or the path is a directory and the request did not ask for `application/x-tar`."),
                        ("403", "Permission denied in the sandbox."),
                        ("404", "No such sandbox (or it is another key's), or no such file."),
                        ("409", "The sandbox is not running."),
                        ("502", "The sandbox's agent failed."),
                    ]), json!({ "200": { "description": "The file's bytes, or the tar archive asked for with `Accept`.",
                        "headers": {
                            "X-Crucible-Mode": { "description": "The file's permission bits, in octal (`0755`).", "schema": { "type": "string" } },
                            "Last-Modified": { "description": "When the file was last modified.", "schema": { "type": "string" } }
                        },
                        "content": binary_content(&["application/octet-stream", crate::files::TAR]) } }))
                }
            }
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } }
        }
    })
}

/// A response's `content` for raw bytes of each of `types`.
fn binary_content(types: &[&str]) -> Value {
    types
        .iter()
        .map(|t| {
            (
                t.to_string(),
                json!({ "schema": { "type": "string", "format": "binary" } }),
            )
        })
        .collect::<Map<_, _>>()
        .into()
}

/// The document as written to `docs/openapi.json`: pretty, with a final newline.
pub fn document_text() -> String {
    let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_referenced_schema_is_defined() {
        let doc = document();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        for piece in text.split("#/components/schemas/").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            assert!(
                schemas.contains_key(&name),
                "{name} is referenced but not defined"
            );
        }
        assert_eq!(
            doc["components"]["schemas"]["ExecRequest"]["properties"]["cmd"]["minItems"],
            1
        );
    }
}
