//! The disk control socket: how the daemon gives a running VM's empty read-only disk (a spare
//! container slot, reserved at boot) its image, on either transport. The daemon opens the
//! image and passes the descriptor, so the device process needs no access to the host's
//! files. The exchange is `contract::disk::control`'s: one request per connection, the line
//! `replace SERIAL`, then one byte carrying the descriptor; one line of answer.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};

use contract::disk::control;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Serves `listener`'s connections one after the other, each with [`serve_one`], until
/// accepting fails (returned): the daemon is the only client, one request at a time.
pub fn serve(
    listener: &UnixListener,
    mut replace: impl FnMut(&str, File) -> Result<u64, String>,
) -> io::Error {
    loop {
        match listener.accept() {
            // A client that went away mid-request has nobody to tell.
            Ok((stream, _)) => drop(serve_one(&stream, &mut replace)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => return e,
        }
    }
}

/// Serves one request on `stream`: `replace` is asked to give the disk named by the request's
/// serial the received image and answers the new capacity in sectors, or why not. Errors are
/// the connection's own (the peer went away); a bad request is answered, not returned.
pub fn serve_one(
    stream: &UnixStream,
    replace: impl FnOnce(&str, File) -> Result<u64, String>,
) -> io::Result<()> {
    let answer = match read_request(stream) {
        Ok((serial, image)) => replace(&serial, image),
        Err(why) => Err(why),
    };
    let mut stream = stream;
    stream.write_all(control::answer(&answer).as_bytes())
}

/// The request's serial and the image it carries, or what is wrong with them.
fn read_request(stream: &UnixStream) -> Result<(String, File), String> {
    // Byte by byte up to the newline: a larger read could take the byte that carries the
    // descriptor with it, and a read without room for it drops the descriptor.
    let mut line = Vec::new();
    let mut byte = [0u8];
    loop {
        let mut reader = stream;
        match reader.read(&mut byte) {
            Ok(0) => return Err("the request ended before its newline".into()),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if line.len() >= control::MAX_REQUEST_BYTES => {
                return Err(format!(
                    "the request is longer than {} bytes",
                    control::MAX_REQUEST_BYTES
                ))
            }
            Ok(_) => line.push(byte[0]),
            Err(e) => return Err(format!("reading the request: {e}")),
        }
    }
    let line = String::from_utf8_lossy(&line);
    let serial = control::parse_request(&line)?;
    match stream.recv_with_fd(&mut byte) {
        Ok((_, Some(image))) => Ok((serial.to_string(), image)),
        Ok((_, None)) => Err("the request carried no image descriptor".into()),
        Err(e) => Err(format!("receiving the image descriptor: {e}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::BufRead;
    use std::os::fd::AsRawFd;

    use super::*;

    fn ask(request: &[u8], image: Option<&File>) -> String {
        let (client, server) = UnixStream::pair().unwrap();
        let replacing = std::thread::spawn(move || {
            serve_one(&server, |serial, image| {
                let len = image.metadata().unwrap().len();
                match serial {
                    "crucible-ctr-1" => Ok(len / 512),
                    other => Err(format!("no disk {other}")),
                }
            })
        });
        let mut writer = &client;
        writer.write_all(request).unwrap();
        if let Some(image) = image {
            client.send_with_fd(&[1u8][..], image.as_raw_fd()).unwrap();
        }
        client.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        io::BufReader::new(&client).read_line(&mut answer).unwrap();
        replacing.join().unwrap().unwrap();
        answer
    }

    #[test]
    fn a_replace_request_hands_its_descriptor_to_the_disk_named() {
        let image = tempfile::tempfile().unwrap();
        image.set_len(4096).unwrap();
        assert_eq!(
            control::parse_answer(&ask(b"replace crucible-ctr-1\n", Some(&image))),
            Ok(8)
        );
        let other = ask(b"replace crucible-ctr-2\n", Some(&image));
        assert_eq!(
            control::parse_answer(&other),
            Err("no disk crucible-ctr-2".into())
        );
    }

    #[test]
    fn a_bad_request_is_answered_with_why() {
        let image = tempfile::tempfile().unwrap();
        for (request, why) in [
            (&b"replace crucible-ctr-1\n"[..], "no image descriptor"),
            (b"replace crucible-ctr-1", "before its newline"),
            (b"eject crucible-ctr-1\n", "eject"),
            (b"replace a b\n", "not a disk serial"),
            (&[b'x'; 200][..], "longer than"),
        ] {
            let answer = ask(request, None);
            let err = control::parse_answer(&answer).unwrap_err();
            assert!(err.contains(why), "{request:?}: {err}");
        }
        // A descriptor after a request the device refuses is closed with the connection.
        let answer = ask(b"replace \n", Some(&image));
        assert!(control::parse_answer(&answer).is_err(), "{answer}");
    }
}
