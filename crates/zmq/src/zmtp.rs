//! The parts of ZMTP 3 (ZeroMQ's wire protocol, RFC 23/ZMTP with the NULL mechanism) that
//! ferromq's own push and pair speak: the greeting, the READY command, message frames both
//! ways, and PING (answered with PONG); other commands are read past.
//!
//! Everything here is a pure function over bytes, so the decoder is tested without sockets and a
//! peer's bytes can never make it panic: sizes are checked before they are used.

use bytes::{Buf, Bytes, BytesMut};

/// The greeting every ZMTP 3.0 peer sends first: signature, version 3.0, the NULL mechanism,
/// not a server, filler.
pub(crate) fn greeting() -> [u8; 64] {
    let mut greeting = [0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting[11] = 0;
    greeting[12..16].copy_from_slice(b"NULL");
    greeting
}

/// What is wrong with a peer's greeting or handshake, as a log line says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandshakeError(pub(crate) String);

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.0)
    }
}

/// Checks a peer's 64-byte greeting: ZMTP 3 or later with the NULL mechanism.
pub(crate) fn check_greeting(greeting: &[u8; 64]) -> Result<(), HandshakeError> {
    if greeting[0] != 0xff || greeting[9] & 1 != 1 {
        return Err(HandshakeError(
            "not a ZMTP peer (its greeting lacks the signature)".to_owned(),
        ));
    }
    if greeting[10] < 3 {
        return Err(HandshakeError(format!(
            "ZMTP {}.{} is too old: 3.0 or later is needed",
            greeting[10], greeting[11]
        )));
    }
    let mechanism = &greeting[12..32];
    let name_len = mechanism.iter().position(|&byte| byte == 0).unwrap_or(20);
    if &mechanism[..name_len] != b"NULL" {
        return Err(HandshakeError(format!(
            "security mechanism {:?} is not supported (only NULL)",
            String::from_utf8_lossy(&mechanism[..name_len])
        )));
    }
    Ok(())
}

/// The READY command announcing `socket_type` (e.g. `PUSH`) and `identity`, as a frame.
pub(crate) fn ready(socket_type: &str, identity: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 + identity.len());
    body.push(5);
    body.extend_from_slice(b"READY");
    for (name, value) in [
        ("Socket-Type", socket_type.as_bytes()),
        ("Identity", identity),
    ] {
        body.push(name.len() as u8);
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(&(value.len() as u32).to_be_bytes());
        body.extend_from_slice(value);
    }
    let mut frame = Vec::with_capacity(body.len() + 9);
    push_header(&mut frame, FLAG_COMMAND, body.len());
    frame.extend_from_slice(&body);
    frame
}

/// The least room a read gets.
const READ_CHUNK: usize = 256 * 1024;

const FLAG_MORE: u8 = 0b001;
const FLAG_LONG: u8 = 0b010;
const FLAG_COMMAND: u8 = 0b100;

/// Appends a frame header (flags, then a 1- or 8-byte size) for a body of `len` bytes.
fn push_header(out: &mut Vec<u8>, flags: u8, len: usize) {
    if len > 255 {
        out.push(flags | FLAG_LONG);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(len as u8);
    }
}

/// Appends the header of message frame `idx` of `n_frames`, whose body is `len` bytes.
pub(crate) fn push_message_header(out: &mut Vec<u8>, idx: usize, n_frames: usize, len: usize) {
    let flags = if idx + 1 < n_frames { FLAG_MORE } else { 0 };
    push_header(out, flags, len);
}

/// A command the peer sent, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// READY with its properties (name, value), in the order sent.
    Ready(Vec<(String, Bytes)>),
    /// ERROR with the peer's reason.
    Error(String),
    /// PING: its context, to be echoed in the PONG.
    Ping(Bytes),
    /// Any other command (PONG, SUBSCRIBE, ...), read past.
    Other,
}

impl Command {
    /// The value of READY property `name` (case-insensitive, as RFC 23 says).
    pub(crate) fn property<'a>(properties: &'a [(String, Bytes)], name: &str) -> Option<&'a Bytes> {
        properties
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
    }
}

/// A frame read from the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Inbound {
    Command(Command),
    /// A message frame: its body, and whether more frames of the same message follow.
    Message {
        body: Bytes,
        more: bool,
    },
}

/// The PONG answering a PING with `context`.
pub(crate) fn pong(context: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(5 + context.len());
    body.push(4);
    body.extend_from_slice(b"PONG");
    body.extend_from_slice(context);
    let mut frame = Vec::with_capacity(body.len() + 9);
    push_header(&mut frame, FLAG_COMMAND, body.len());
    frame.extend_from_slice(&body);
    frame
}

/// Reads frames out of the bytes a peer sent, as they arrive in pieces. Message bodies are split
/// off the read buffer, not copied.
#[derive(Debug)]
pub(crate) struct Decoder {
    buffer: BytesMut,
    /// The largest frame accepted; a larger one ends the connection (a PULL peer sends only
    /// small commands).
    max_frame: usize,
}

impl Decoder {
    pub(crate) fn new(max_frame: usize) -> Decoder {
        Decoder {
            buffer: BytesMut::new(),
            max_frame,
        }
    }

    /// Adds bytes read from the peer.
    #[cfg(test)]
    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The peer's 64-byte greeting, once it is all there (it comes before any frame).
    pub(crate) fn take_greeting(&mut self) -> Option<[u8; 64]> {
        if self.buffer.len() < 64 {
            return None;
        }
        let greeting = self.buffer.split_to(64);
        Some(greeting[..].try_into().expect("64 bytes"))
    }

    /// The buffer to read into, with room for at least the rest of the frame begun (up to
    /// 16 MiB at a time) or [`READ_CHUNK`]: several frames come in with one read, and their
    /// bodies share one allocation.
    pub(crate) fn read_buffer(&mut self) -> &mut BytesMut {
        let wanted = self.missing().clamp(READ_CHUNK, 16 << 20);
        self.buffer.reserve(wanted);
        &mut self.buffer
    }

    /// How many more bytes the frame at the front needs, as far as its header tells.
    fn missing(&self) -> usize {
        let Some(&flags) = self.buffer.first() else {
            return 0;
        };
        let announced = if flags & FLAG_LONG != 0 {
            self.buffer
                .get(1..9)
                .map(|size| u64::from_be_bytes(size.try_into().expect("eight bytes")))
                .and_then(|size| usize::try_from(size).ok())
                .map(|size| size.saturating_add(9))
        } else {
            self.buffer.get(1).map(|&size| usize::from(size) + 2)
        };
        announced
            .unwrap_or(0)
            .min(self.max_frame.saturating_add(9))
            .saturating_sub(self.buffer.len())
    }

    /// The next whole frame, `Ok(None)` when more bytes are needed, an error for a frame over
    /// the limit or a malformed command.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Inbound>, HandshakeError> {
        let Some(&flags) = self.buffer.first() else {
            return Ok(None);
        };
        let (header_len, len) = if flags & FLAG_LONG != 0 {
            let Some(size) = self.buffer.get(1..9) else {
                return Ok(None);
            };
            let size = u64::from_be_bytes(size.try_into().expect("eight bytes"));
            (9, usize::try_from(size).unwrap_or(usize::MAX))
        } else {
            let Some(&size) = self.buffer.get(1) else {
                return Ok(None);
            };
            (2, usize::from(size))
        };
        if len > self.max_frame {
            return Err(HandshakeError(format!(
                "the peer sent a frame of {len} bytes; at most {} are expected here",
                self.max_frame
            )));
        }
        if self.buffer.len() < header_len + len {
            return Ok(None);
        }
        let frame = if flags & FLAG_COMMAND != 0 {
            let command = decode_command(&self.buffer[header_len..header_len + len])?;
            self.buffer.advance(header_len + len);
            Inbound::Command(command)
        } else {
            self.buffer.advance(header_len);
            Inbound::Message {
                body: self.buffer.split_to(len).freeze(),
                more: flags & FLAG_MORE != 0,
            }
        };
        Ok(Some(frame))
    }
}

fn malformed(what: &str) -> HandshakeError {
    HandshakeError(format!("malformed {what} command from the peer"))
}

fn decode_command(body: &[u8]) -> Result<Command, HandshakeError> {
    let (&name_len, rest) = body.split_first().ok_or_else(|| malformed("empty"))?;
    let name = rest
        .get(..usize::from(name_len))
        .ok_or_else(|| malformed("truncated"))?;
    let data = &rest[usize::from(name_len)..];
    match name {
        b"READY" => decode_properties(data).map(Command::Ready),
        b"ERROR" => {
            let reason = data
                .split_first()
                .and_then(|(&len, reason)| reason.get(..usize::from(len)))
                .ok_or_else(|| malformed("ERROR"))?;
            Ok(Command::Error(String::from_utf8_lossy(reason).into_owned()))
        }
        b"PING" => {
            // A two-byte TTL, then the context to echo.
            let context = data.get(2..).ok_or_else(|| malformed("PING"))?;
            Ok(Command::Ping(Bytes::copy_from_slice(context)))
        }
        _ => Ok(Command::Other),
    }
}

fn decode_properties(mut data: &[u8]) -> Result<Vec<(String, Bytes)>, HandshakeError> {
    let mut properties = Vec::new();
    while let Some((&name_len, rest)) = data.split_first() {
        let name = rest
            .get(..usize::from(name_len))
            .ok_or_else(|| malformed("READY"))?;
        let rest = &rest[usize::from(name_len)..];
        let value_len = rest.get(..4).ok_or_else(|| malformed("READY"))?;
        let value_len = u32::from_be_bytes(value_len.try_into().expect("four bytes"));
        let value_len = usize::try_from(value_len).map_err(|_| malformed("READY"))?;
        let value = rest
            .get(4..4 + value_len)
            .ok_or_else(|| malformed("READY"))?;
        properties.push((
            String::from_utf8_lossy(name).into_owned(),
            Bytes::copy_from_slice(value),
        ));
        data = &rest[4 + value_len..];
    }
    Ok(properties)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_greeting_passes_our_check_and_others_are_refused() {
        assert_eq!(check_greeting(&greeting()), Ok(()));
        let mut old = greeting();
        old[10] = 2;
        assert!(check_greeting(&old).unwrap_err().0.contains("2.0"));
        let mut curve = greeting();
        curve[12..17].copy_from_slice(b"CURVE");
        assert!(check_greeting(&curve).unwrap_err().0.contains("CURVE"));
        assert!(check_greeting(&[0u8; 64]).is_err());
    }

    #[test]
    fn a_ready_command_reads_back_with_its_properties() {
        let mut decoder = Decoder::new(1024);
        let frame = ready("PUSH", b"fmq:zeromq:-:1:2");
        // In two pieces, as a socket may deliver it.
        decoder.extend(&frame[..5]);
        assert_eq!(decoder.next_frame(), Ok(None));
        decoder.extend(&frame[5..]);
        let Some(Inbound::Command(Command::Ready(properties))) = decoder.next_frame().unwrap()
        else {
            panic!("not a READY");
        };
        assert_eq!(
            Command::property(&properties, "socket-type").map(|value| &value[..]),
            Some(&b"PUSH"[..])
        );
        assert_eq!(
            Command::property(&properties, "Identity").map(|value| &value[..]),
            Some(&b"fmq:zeromq:-:1:2"[..])
        );
        assert_eq!(decoder.next_frame(), Ok(None));
    }

    #[test]
    fn a_ping_is_decoded_and_answered_with_its_context() {
        let mut ping = vec![FLAG_COMMAND, 9, 4];
        ping.extend_from_slice(b"PING");
        ping.extend_from_slice(&[0, 10, b'h', b'i']);
        let mut decoder = Decoder::new(1024);
        decoder.extend(&ping);
        assert_eq!(
            decoder.next_frame(),
            Ok(Some(Inbound::Command(Command::Ping(Bytes::from_static(
                b"hi"
            )))))
        );
        assert_eq!(
            &pong(b"hi")[..],
            &[FLAG_COMMAND, 7, 4, b'P', b'O', b'N', b'G', b'h', b'i']
        );
    }

    #[test]
    fn hostile_frames_are_errors_not_panics() {
        // Over the limit, announced with a long size.
        let mut decoder = Decoder::new(16);
        let mut huge = vec![FLAG_COMMAND | FLAG_LONG];
        huge.extend_from_slice(&u64::MAX.to_be_bytes());
        decoder.extend(&huge);
        assert!(decoder.next_frame().is_err());
        // A command whose name runs past its body, a READY whose value does.
        for body in [
            &[9u8, b'R'][..],
            &[5, b'R', b'E', b'A', b'D', b'Y', 1, b'x', 0, 0, 0, 9],
        ] {
            let mut decoder = Decoder::new(1024);
            let mut frame = vec![FLAG_COMMAND, body.len() as u8];
            frame.extend_from_slice(body);
            decoder.extend(&frame);
            assert!(decoder.next_frame().is_err(), "{body:?}");
        }
        // Message frames come out with their bodies.
        let mut decoder = Decoder::new(1024);
        decoder.extend(&[FLAG_MORE, 1, b'x', 0, 2, b'y', b'z']);
        assert_eq!(
            decoder.next_frame(),
            Ok(Some(Inbound::Message {
                body: Bytes::from_static(b"x"),
                more: true
            }))
        );
        assert_eq!(
            decoder.next_frame(),
            Ok(Some(Inbound::Message {
                body: Bytes::from_static(b"yz"),
                more: false
            }))
        );
    }

    #[test]
    fn message_headers_mark_more_and_long() {
        let mut out = Vec::new();
        push_message_header(&mut out, 0, 2, 3);
        push_message_header(&mut out, 1, 2, 300);
        assert_eq!(out[..2], [FLAG_MORE, 3]);
        assert_eq!(out[2], FLAG_LONG);
        assert_eq!(out[3..], 300u64.to_be_bytes());
    }
}
