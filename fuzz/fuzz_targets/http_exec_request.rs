//! The daemon's path from raw HTTP bytes to a validated `ExecRequest`, both ways in:
//! - the connection front door (`api::front_door`): the connection's first request head,
//!   delimited by `http1::head_end` (as the front door's `HeadScanner` delimits it), is parsed
//!   once with `parse_first_head`; an exec it serves itself takes its body by
//!   `Content-Length`, then `json::parse_json` and `ExecRequest::validate` decide;
//! - the one-shot `POST /sandboxes/{id}/exec` body: `json::parse_json` + `validate` on the
//!   whole input.
//!
//! Checked:
//! - a recognised hijack really is `POST /sandboxes/{id}/exec?stdin=1|true` without any
//!   `Upgrade` header, and its `Content-Length` and `Authorization` are the headers' values;
//!   refusals are 400s, 431s (too many header fields) or 505s (another HTTP version);
//! - a parsed `ExecRequest` round-trips through JSON;
//! - a validated `ExecRequest` can be handed to `execve` (no NUL, proper names, absolute cwd,
//!   bounded sizes) and fits in one agent message, which the agent parses back unchanged: what
//!   the daemon accepts, the agent can run.

#![no_main]

use std::ffi::CString;

use api::config::{JSON_BODY_LIMIT, MAX_HEAD};
use api::front_door::parse_first_head;
use api::json::parse_json;
use http::StatusCode;
use libfuzzer_sys::fuzz_target;
use wire::agent::AgentRequest;
use wire::{encode_message, read_message, ExecRequest};

/// What the daemon does with an exec body; checks what it accepts.
fn exec_body(body: &[u8]) {
    let Ok(request) = parse_json::<ExecRequest>(body, "ExecRequest") else {
        return;
    };
    let json = serde_json::to_vec(&request).expect("a parsed request serializes");
    let back: ExecRequest = serde_json::from_slice(&json).expect("re-serialized request parses");
    assert_eq!(back, request, "ExecRequest did not round-trip");
    if request.validate().is_err() {
        return;
    }
    assert!(!request.cmd.is_empty() && !request.cmd[0].is_empty());
    for arg in &request.cmd {
        assert!(
            CString::new(arg.as_bytes()).is_ok(),
            "NUL in a validated argument"
        );
    }
    for (name, value) in &request.env {
        assert!(!name.is_empty() && !name.contains('='));
        assert!(CString::new(format!("{name}={value}")).is_ok());
    }
    assert!(request.cwd.is_empty() || request.cwd.starts_with('/'));
    assert!(CString::new(request.cwd.as_bytes()).is_ok());
    assert!((0..=wire::MAX_TIMEOUT_S).contains(&request.timeout_s));

    let to_agent = AgentRequest::Exec {
        request: request.clone(),
        interactive: true,
        user: None,
        tail_bytes: Some(wire::agent::DEFAULT_TAIL_BYTES),
    };
    let message = encode_message(&to_agent).expect("a validated request fits one agent message");
    let received: AgentRequest = read_message(&mut &message[..]).expect("the agent parses it");
    assert_eq!(received, to_agent, "the agent would run something else");
}

fuzz_target!(|data: &[u8]| {
    // The one-shot POST: the whole input is the body.
    exec_body(data);

    // The hijack front: the input is the connection's first bytes.
    let Ok(Some(end)) = http1::head_end(data, MAX_HEAD) else {
        return;
    };
    let (head, rest) = data.split_at(end);
    let parsed = match parse_first_head(head) {
        Ok(parsed) => parsed,
        Err(error) => {
            assert!(
                [
                    StatusCode::BAD_REQUEST,
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                ]
                .contains(&error.status),
                "{error}"
            );
            return;
        }
    };
    let Some(hijack) = parsed else {
        return;
    };
    let text = String::from_utf8_lossy(head);
    // httparse, like RFC 9112, skips empty lines before the request line.
    let mut lines = text.lines().skip_while(|line| line.is_empty());
    let request_line = lines.next().unwrap_or("");
    assert!(
        request_line.starts_with("POST "),
        "hijacked a non-POST: {request_line:?}"
    );
    let target = request_line.split(' ').nth(1).unwrap_or("");
    // A fragment is no part of the path or the query (hyper's URI parser drops it too).
    let without_fragment = target.split_once('#').map_or(target, |(before, _)| before);
    let (path, query) = without_fragment
        .split_once('?')
        .unwrap_or((without_fragment, ""));
    let expected = match &hijack.attach {
        None => format!("/sandboxes/{}/exec", hijack.id),
        Some(attach) => {
            assert!(hijack.interactive, "only an interactive attach is hijacked");
            format!("/sandboxes/{}/execs/{}/attach", hijack.id, attach.exec_id)
        }
    };
    assert_eq!(path, expected, "wrong sandbox or exec id");
    let stdin = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("stdin="));
    assert_eq!(
        hijack.interactive,
        stdin.is_some_and(|v| v == "1" || v == "true"),
        "interactive or not against the query: {target:?}"
    );
    // The head ends at the first empty line, as httparse (which accepts bare LF line ends)
    // sees it. Values lose their spaces and tabs at either end (not Unicode whitespace such
    // as U+0085, which is a value's own).
    let headers: Vec<(String, String)> = lines
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| {
            let value = value.trim_matches([' ', '\t']);
            (name.to_ascii_lowercase(), value.to_string())
        })
        .collect();
    assert!(
        headers.iter().all(|(name, _)| name != "upgrade"),
        "hijacked an Upgrade request"
    );
    if !hijack.interactive {
        // A one-shot the front door serves needs a length it can read the body by.
        assert!(
            hijack.content_length.is_some(),
            "a one-shot without Content-Length"
        );
        assert!(
            headers
                .iter()
                .all(|(name, _)| name != "expect" && name != "transfer-encoding"),
            "served a one-shot that hyper must: {headers:?}"
        );
    }
    let values = |wanted: &str| -> Vec<&str> {
        headers
            .iter()
            .filter(|(name, _)| name == wanted)
            .map(|(_, value)| value.as_str())
            .collect()
    };
    // At most one of each: a second is how a smuggler makes two readers disagree.
    let lengths = values("content-length");
    assert!(
        lengths.len() <= 1,
        "served two Content-Lengths: {headers:?}"
    );
    assert_eq!(
        lengths.first().and_then(|v| v.parse().ok()),
        hijack.content_length,
        "Content-Length against the header: {headers:?}"
    );
    let authorizations = values("authorization");
    assert!(authorizations.len() <= 1, "served two Authorizations");
    if let (Some(ours), Some(theirs)) = (&hijack.authorization, authorizations.first()) {
        assert_eq!(String::from_utf8_lossy(ours), *theirs);
    }
    assert_eq!(hijack.authorization.is_some(), !authorizations.is_empty());
    if hijack.content_length.is_some() {
        assert!(
            values("transfer-encoding").is_empty(),
            "served a body framed by both Content-Length and Transfer-Encoding"
        );
    }
    if let (Some(length), false) = (hijack.content_length, hijack.chunked) {
        if length <= JSON_BODY_LIMIT && rest.len() >= length {
            exec_body(&rest[..length]);
        }
    }
});
