// Every failure the SDK raises is a CrucibleError, so `catch (e) { if (e instanceof
// CrucibleError) … }` is one test. Errors the daemon sends carry its HTTP status and its stable
// `code` (docs/api.md "Errors"); failures found on this side (unreachable daemon, broken frame
// stream, a command the caller asked to fail loudly) have status 0 and a code of our own.

/** What the daemon said, or 0 when the failure was found on the client's side. */
export class CrucibleError extends Error {
  readonly status: number;
  readonly code: string;

  constructor(status: number, code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.status = status;
    this.code = code;
  }

  override get name(): string {
    return this.constructor.name;
  }
}

/** 400 `invalid_request`: bad JSON, an unknown field, a failed validation (the message names the field). */
export class InvalidRequest extends CrucibleError {}
/** 400 `refused_entry`: an uploaded tar entry would escape its destination, or is a device node. */
export class RefusedEntry extends CrucibleError {}
/** 400 `invalid_image`: an image archive that is not a usable image. */
export class InvalidImage extends CrucibleError {}
/** 400 `is_a_directory`: a file download named a directory. */
export class IsADirectory extends CrucibleError {}
/** 401 `unauthorized`: a wrong API key, or none over TCP. */
export class Unauthorized extends CrucibleError {}
/** 403 `permission_denied`: the sandbox's agent may not read or write that path. */
export class PermissionDenied extends CrucibleError {}
/** 403 `egress_not_allowed`: a `network.allow` rule outside the operator's `--egress-allow`. */
export class EgressNotAllowed extends CrucibleError {}
/** 404 `not_found`; the subclasses say what was looked up. */
export class NotFound extends CrucibleError {}
/** 404 `not_found` for a sandbox id (unknown, or another key's). */
export class SandboxNotFound extends NotFound {}
/** 404 `not_found` for an image name. */
export class ImageNotFound extends NotFound {}
/** 404 `not_found` for a cache name. */
export class CacheNotFound extends NotFound {}
/** 404 `not_found` for a guest file. */
export class FileNotFound extends NotFound {}
/** 404 `exec_not_found` (re-attach), or `not_found` for a signal to an exec_id that does not run. */
export class ExecNotFound extends NotFound {}
/** 404 container_not_found: the sandbox has no container of this name. */
export class ContainerNotFound extends NotFound {}
/** 422 container_not_ready: a container of the create did not become ready; the message ends with its log's last lines. */
export class ContainerNotReady extends CrucibleError {}
/** 405 `method_not_allowed`. */
export class MethodNotAllowed extends CrucibleError {}
/** 408 `request_timeout`: the daemon waited 30 s for the request. */
export class RequestTimeout extends CrucibleError {}
/** 409 `conflict`: the sandbox is dead or being deleted, a cache or image is in use, an exec is attached elsewhere. */
export class Conflict extends CrucibleError {}
/** 409 `cache_busy` (docs/api.md's name for a cache held by another sandbox). */
export class CacheBusy extends Conflict {}
/** 409 `not_supported`: the backend or agent cannot do this (stats, signal). */
export class NotSupported extends CrucibleError {}
/** 411 `length_required`. */
export class LengthRequired extends CrucibleError {}
/** 413 `payload_too_large`: a JSON body over 2 MiB. */
export class PayloadTooLarge extends CrucibleError {}
/** 413 `no_space`: an upload filled the sandbox's disk. */
export class NoSpace extends CrucibleError {}
/** 413 `image_too_large`: past `crucible serve --image-max-mib`. */
export class ImageTooLarge extends CrucibleError {}
/** 426 `upgrade_required`. */
export class UpgradeRequired extends CrucibleError {}
/** 429 `too_many_requests`: the sandbox cap or the per-sandbox exec cap; retry. */
export class TooManyRequests extends CrucibleError {}
/** 431 `headers_too_large`. */
export class HeadersTooLarge extends CrucibleError {}
/** 500 `internal`: the sandbox could not be started. */
export class InternalError extends CrucibleError {}
/** 500 `io_error`: the agent failed to read or write a file. */
export class IoError extends CrucibleError {}
/** 502 `agent_error`: the sandbox's agent failed or could not be reached. */
export class AgentError extends CrucibleError {}
/** 503 `backend_unavailable`: the requested backend cannot run on this host. */
export class BackendUnavailable extends CrucibleError {}
/** 503 `shutting_down`: the daemon is stopping. */
export class ShuttingDown extends CrucibleError {}
/** 503 `too_many_connections`: the daemon holds `--max-connections` connections. */
export class TooManyConnections extends CrucibleError {}
/** 505 `http_version_not_supported`. */
export class HttpVersionNotSupported extends CrucibleError {}
/** 507 `insufficient_storage`: the disk budget has no room. */
export class InsufficientStorage extends CrucibleError {}

/** Status 0, `unreachable`: the daemon could not be reached, or hung up before answering. */
export class ConnectionError extends CrucibleError {}

type ErrorClass = new (status: number, code: string, message: string, options?: { cause?: unknown }) => CrucibleError;

const BY_CODE: Readonly<Record<string, ErrorClass>> = {
  invalid_request: InvalidRequest,
  refused_entry: RefusedEntry,
  invalid_image: InvalidImage,
  is_a_directory: IsADirectory,
  unauthorized: Unauthorized,
  permission_denied: PermissionDenied,
  egress_not_allowed: EgressNotAllowed,
  not_found: NotFound,
  exec_not_found: ExecNotFound,
  container_not_found: ContainerNotFound,
  container_not_ready: ContainerNotReady,
  method_not_allowed: MethodNotAllowed,
  request_timeout: RequestTimeout,
  conflict: Conflict,
  cache_busy: CacheBusy,
  not_supported: NotSupported,
  length_required: LengthRequired,
  payload_too_large: PayloadTooLarge,
  no_space: NoSpace,
  image_too_large: ImageTooLarge,
  upgrade_required: UpgradeRequired,
  too_many_requests: TooManyRequests,
  headers_too_large: HeadersTooLarge,
  internal: InternalError,
  io_error: IoError,
  agent_error: AgentError,
  backend_unavailable: BackendUnavailable,
  shutting_down: ShuttingDown,
  too_many_connections: TooManyConnections,
  http_version_not_supported: HttpVersionNotSupported,
  insufficient_storage: InsufficientStorage,
};

/**
 * What a request was about: the daemon answers `not_found` for a sandbox, an image, a cache or
 * a file alike, and only the caller knows which it asked for.
 */
export type Subject = "sandbox" | "image" | "cache" | "file" | "exec";

const NOT_FOUND_BY_SUBJECT: Readonly<Record<Subject, ErrorClass>> = {
  sandbox: SandboxNotFound,
  image: ImageNotFound,
  cache: CacheNotFound,
  file: FileNotFound,
  exec: ExecNotFound,
};

/** The error class for a daemon's `{code, message}`, refined by what the request was about. */
export function errorFor(status: number, code: string, message: string, subject?: Subject): CrucibleError {
  if (code === "not_found" && subject !== undefined) {
    // A sandbox route answers not_found for its sandbox, but a file route's not_found may be
    // the file: the message names a sandbox id when it is the sandbox.
    const cls =
      subject === "file" || subject === "exec"
        ? /^no sandbox with id/.test(message)
          ? SandboxNotFound
          : NOT_FOUND_BY_SUBJECT[subject]
        : NOT_FOUND_BY_SUBJECT[subject];
    return new cls(status, code, message);
  }
  const cls = BY_CODE[code] ?? CrucibleError;
  return new cls(status, code, message);
}

/** The error for an HTTP answer of `status` with `body`, the JSON envelope when it is one. */
export function errorFromBody(status: number, body: string, subject?: Subject): CrucibleError {
  try {
    const envelope: unknown = JSON.parse(body);
    if (
      typeof envelope === "object" &&
      envelope !== null &&
      typeof (envelope as { code?: unknown }).code === "string" &&
      typeof (envelope as { message?: unknown }).message === "string"
    ) {
      const { code, message } = envelope as { code: string; message: string };
      return errorFor(status, code, message, subject);
    }
  } catch {
    // Not JSON: a proxy in front of the daemon, or a daemon from before the envelope.
  }
  const text = body.trim() || `HTTP ${status}`;
  return new CrucibleError(status, "unknown", text.length > 512 ? `${text.slice(0, 512)}…` : text);
}
