//! The parts of ZMTP 3 (ZeroMQ's wire protocol, RFC 23/ZMTP with the NULL mechanism) that
//! ferromq's own sockets (push, pull, pair, pub) speak: the greeting, the READY command, message frames both
//! ways, and PING (answered with PONG); other commands are read past.
//!
//! Everything here is a pure function over bytes, so the decoder is tested without sockets and a
//! peer's bytes can never make it panic: sizes are checked before they are used.

use bytes::{Buf, Bytes, BytesMut};
use ferromq_core::Message;

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
    let mut frame = Vec::with_capacity(body.len() + LONG_HEADER);
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
#[derive(Debug)]
pub(crate) enum Inbound {
    Command(Command),
    /// A message frame: its body, and whether more frames of the same message follow.
    Message {
        body: Message,
        more: bool,
    },
}

/// The PONG answering a PING with `context`.
pub(crate) fn pong(context: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(5 + context.len());
    body.push(4);
    body.extend_from_slice(b"PONG");
    body.extend_from_slice(context);
    let mut frame = Vec::with_capacity(body.len() + LONG_HEADER);
    push_header(&mut frame, FLAG_COMMAND, body.len());
    frame.extend_from_slice(&body);
    frame
}

/// Message bodies larger than one read's room ([`READ_CHUNK`]) are read straight into a buffer
/// of their own, made by `heap_pool` (recycled on the thread that drops it, not zeroed), instead
/// of growing the shared read buffer: a stream of 1 MiB messages then costs no copy in user space
/// at the receiver (growing and moving the read buffer was 13 % of a 1 MiB sink) and no fresh
/// pages per message.
pub(crate) const LARGE_BODY: usize = READ_CHUNK + 1;

/// The longest frame header: flags and an eight-byte size; also what is read after a large body
/// ([`ReadTarget::Header`]).
pub(crate) const LONG_HEADER: usize = 9;

/// A large message body being read into its own buffer.
#[derive(Debug)]
struct LargeBody {
    message: Message,
    /// Bytes of it read so far.
    filled: usize,
    more: bool,
}

/// Where the next read from the peer goes (see [`Decoder::read_target`]).
pub(crate) enum ReadTarget<'a> {
    /// The shared read buffer, as much as it has room for.
    Buffer(&'a mut BytesMut),
    /// The rest of a large body; report what was read with [`Decoder::body_filled`].
    Body(&'a mut [u8]),
    /// At most a frame header's bytes (the frame after a large body is likely large too, and
    /// its body should not land in the shared buffer); hand them to [`Decoder::accept`].
    Header,
}

/// Reads frames out of the bytes a peer sent, as they arrive in pieces. Message bodies are split
/// off the read buffer, not copied; bodies of [`LARGE_BODY`] bytes or more are read into
/// buffers of their own.
#[derive(Debug)]
pub(crate) struct Decoder {
    buffer: BytesMut,
    /// The largest frame accepted; a larger one ends the connection (a PULL peer sends only
    /// small commands).
    max_frame: usize,
    /// The large body being read, if any.
    large: Option<LargeBody>,
    /// The last frame was a large body: the next read takes only a header's worth.
    after_large: bool,
}

impl Decoder {
    pub(crate) fn new(max_frame: usize) -> Decoder {
        Decoder {
            buffer: BytesMut::new(),
            max_frame,
            large: None,
            after_large: false,
        }
    }

    /// Adds bytes read from the peer (elsewhere than through [`Decoder::read_target`]): the
    /// rest of a large body first, the remainder to the read buffer.
    pub(crate) fn accept(&mut self, mut bytes: &[u8]) {
        if let Some(large) = &mut self.large {
            let body = large.message.data_mut();
            let n = bytes.len().min(body.len() - large.filled);
            body[large.filled..large.filled + n].copy_from_slice(&bytes[..n]);
            large.filled += n;
            bytes = &bytes[n..];
        }
        self.buffer.extend_from_slice(bytes);
    }

    /// Whether a large body is being read and is not whole yet.
    pub(crate) fn in_large_body(&self) -> bool {
        self.large
            .as_ref()
            .is_some_and(|large| large.filled < large.message.len())
    }

    /// The peer's 64-byte greeting, once it is all there (it comes before any frame).
    pub(crate) fn take_greeting(&mut self) -> Option<[u8; 64]> {
        if self.buffer.len() < 64 {
            return None;
        }
        let greeting = self.buffer.split_to(64);
        Some(greeting[..].try_into().expect("64 bytes"))
    }

    /// Where the next read goes: the rest of a large body, a header's worth after a large
    /// body, else the read buffer.
    pub(crate) fn read_target(&mut self) -> ReadTarget<'_> {
        let body_unfinished = self
            .large
            .as_ref()
            .is_some_and(|large| large.filled < large.message.len());
        if body_unfinished {
            let large = self.large.as_mut().expect("a body is being read");
            let filled = large.filled;
            return ReadTarget::Body(&mut large.message.data_mut()[filled..]);
        }
        if self.after_large && self.buffer.is_empty() {
            self.after_large = false;
            return ReadTarget::Header;
        }
        ReadTarget::Buffer(self.read_buffer())
    }

    /// `n` more bytes of the large body were read into what [`ReadTarget::Body`] lent.
    pub(crate) fn body_filled(&mut self, n: usize) {
        if let Some(large) = &mut self.large {
            large.filled = (large.filled + n).min(large.message.len());
        }
    }

    /// The buffer to read into, with room for at least the rest of the frame begun (up to
    /// 16 MiB at a time) or [`READ_CHUNK`]: several frames come in with one read, and their
    /// bodies share one allocation.
    fn read_buffer(&mut self) -> &mut BytesMut {
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
                .get(1..LONG_HEADER)
                .map(|size| u64::from_be_bytes(size.try_into().expect("eight bytes")))
                .and_then(|size| usize::try_from(size).ok())
                .map(|size| size.saturating_add(LONG_HEADER))
        } else {
            self.buffer.get(1).map(|&size| usize::from(size) + 2)
        };
        announced
            .unwrap_or(0)
            .min(self.max_frame.saturating_add(LONG_HEADER))
            .saturating_sub(self.buffer.len())
    }

    /// The next whole frame, `Ok(None)` when more bytes are needed, an error for a frame over
    /// the limit, a malformed command, or a large body whose buffer cannot be had.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Inbound>, HandshakeError> {
        if let Some(large) = &self.large {
            if large.filled < large.message.len() {
                return Ok(None);
            }
            let large = self.large.take().expect("checked above");
            self.after_large = true;
            return Ok(Some(Inbound::Message {
                body: large.message,
                more: large.more,
            }));
        }
        let Some(&flags) = self.buffer.first() else {
            return Ok(None);
        };
        let (header_len, len) = if flags & FLAG_LONG != 0 {
            let Some(size) = self.buffer.get(1..LONG_HEADER) else {
                return Ok(None);
            };
            let size = u64::from_be_bytes(size.try_into().expect("eight bytes"));
            (LONG_HEADER, usize::try_from(size).unwrap_or(usize::MAX))
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
            if flags & FLAG_COMMAND == 0 && len >= LARGE_BODY {
                self.begin_large_body(header_len, len, flags & FLAG_MORE != 0)?;
            }
            return Ok(None);
        }
        let frame = if flags & FLAG_COMMAND != 0 {
            let command = decode_command(&self.buffer[header_len..header_len + len])?;
            self.buffer.advance(header_len + len);
            Inbound::Command(command)
        } else {
            self.buffer.advance(header_len);
            Inbound::Message {
                body: Message::from(self.buffer.split_to(len).freeze()),
                more: flags & FLAG_MORE != 0,
            }
        };
        Ok(Some(frame))
    }

    /// Moves the large body whose header (and maybe first bytes) the read buffer holds into a
    /// buffer of its own; the read buffer is then empty.
    fn begin_large_body(
        &mut self,
        header_len: usize,
        len: usize,
        more: bool,
    ) -> Result<(), HandshakeError> {
        let mut message = crate::heap_pool::message(len).map_err(|error| {
            HandshakeError(format!(
                "cannot allocate {len} bytes for a message from the peer: {error}"
            ))
        })?;
        self.buffer.advance(header_len);
        let filled = self.buffer.len();
        message.data_mut()[..filled].copy_from_slice(&self.buffer);
        self.buffer.clear();
        self.large = Some(LargeBody {
            message,
            filled,
            more,
        });
        Ok(())
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
        decoder.accept(&frame[..5]);
        assert!(matches!(decoder.next_frame(), Ok(None)));
        decoder.accept(&frame[5..]);
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
        assert!(matches!(decoder.next_frame(), Ok(None)));
    }

    #[test]
    fn a_ping_is_decoded_and_answered_with_its_context() {
        let mut ping = vec![FLAG_COMMAND, 9, 4];
        ping.extend_from_slice(b"PING");
        ping.extend_from_slice(&[0, 10, b'h', b'i']);
        let mut decoder = Decoder::new(1024);
        decoder.accept(&ping);
        let Ok(Some(Inbound::Command(command))) = decoder.next_frame() else {
            panic!("not a command");
        };
        assert_eq!(command, Command::Ping(Bytes::from_static(b"hi")));
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
        decoder.accept(&huge);
        assert!(decoder.next_frame().is_err());
        // A command whose name runs past its body, a READY whose value does.
        for body in [
            &[9u8, b'R'][..],
            &[5, b'R', b'E', b'A', b'D', b'Y', 1, b'x', 0, 0, 0, 9],
        ] {
            let mut decoder = Decoder::new(1024);
            let mut frame = vec![FLAG_COMMAND, body.len() as u8];
            frame.extend_from_slice(body);
            decoder.accept(&frame);
            assert!(decoder.next_frame().is_err(), "{body:?}");
        }
        // Message frames come out with their bodies.
        let mut decoder = Decoder::new(1024);
        decoder.accept(&[FLAG_MORE, 1, b'x', 0, 2, b'y', b'z']);
        let [first, second] = [true, false].map(|_| message_frame(&mut decoder));
        assert_eq!(first, (b"x".to_vec(), true));
        assert_eq!(second, (b"yz".to_vec(), false));
    }

    /// The next frame of `decoder`, which must be a whole message frame: body and `more`.
    fn message_frame(decoder: &mut Decoder) -> (Vec<u8>, bool) {
        match decoder.next_frame() {
            Ok(Some(Inbound::Message { body, more })) => (body.data().to_vec(), more),
            other => panic!("not a message frame: {other:?}"),
        }
    }

    /// Feeds `bytes` to `decoder` as reads would, `chunk` bytes at most per read, and returns
    /// the message frames it decoded.
    fn feed(decoder: &mut Decoder, bytes: &[u8], chunk: usize) -> Vec<(Vec<u8>, bool)> {
        let mut frames = Vec::new();
        let mut rest = bytes;
        loop {
            while let Some(frame) = decoder.next_frame().expect("well-formed") {
                let Inbound::Message { body, more } = frame else {
                    panic!("a command");
                };
                frames.push((body.data().to_vec(), more));
            }
            if rest.is_empty() {
                return frames;
            }
            let n = match decoder.read_target() {
                ReadTarget::Buffer(buffer) => {
                    let n = chunk.min(rest.len());
                    buffer.extend_from_slice(&rest[..n]);
                    n
                }
                ReadTarget::Body(body) => {
                    let n = chunk.min(rest.len()).min(body.len());
                    body[..n].copy_from_slice(&rest[..n]);
                    decoder.body_filled(n);
                    n
                }
                ReadTarget::Header => {
                    let n = chunk.min(rest.len()).min(LONG_HEADER);
                    decoder.accept(&rest[..n]);
                    n
                }
            };
            rest = &rest[n..];
        }
    }

    #[test]
    fn large_bodies_are_read_into_their_own_buffers_whole_and_in_order() {
        // Large, small, large (the last of two frames), then small again: every body whole,
        // with its `more` flag, whatever the read sizes.
        let sizes = [LARGE_BODY + 5, 3, 300, 2 * LARGE_BODY, 7, LARGE_BODY, 1];
        let mut wire = Vec::new();
        let mut expected = Vec::new();
        for (idx, &size) in sizes.iter().enumerate() {
            let body: Vec<u8> = (0..size).map(|byte| (byte * 7 + idx) as u8).collect();
            let more = idx == 4;
            push_header(&mut wire, if more { FLAG_MORE } else { 0 }, size);
            wire.extend_from_slice(&body);
            expected.push((body, more));
        }
        for chunk in [1, 2, 9, 10, 4096, READ_CHUNK, usize::MAX] {
            let mut decoder = Decoder::new(usize::MAX);
            let frames = feed(&mut decoder, &wire, chunk);
            assert_eq!(frames.len(), expected.len(), "reads of {chunk}");
            for (idx, (frame, want)) in frames.iter().zip(&expected).enumerate() {
                assert!(frame == want, "frame {idx} with reads of {chunk}");
            }
        }
        // Bytes read early (by the writer) go to the body being read, then to the buffer.
        let mut decoder = Decoder::new(usize::MAX);
        let split = 100;
        decoder.accept(&wire[..split]);
        assert!(decoder.next_frame().unwrap().is_none());
        decoder.accept(&wire[split..]);
        let mut n_frames = 0;
        while let Some(frame) = decoder.next_frame().unwrap() {
            let Inbound::Message { body, more } = frame else {
                panic!("a command");
            };
            assert!((body.data().to_vec(), more) == expected[n_frames]);
            n_frames += 1;
        }
        assert_eq!(n_frames, expected.len());
    }

    #[test]
    fn a_large_body_that_cannot_be_allocated_is_an_error_not_an_abort() {
        let mut decoder = Decoder::new(usize::MAX);
        let mut wire = Vec::new();
        push_header(&mut wire, 0, usize::MAX / 4);
        wire.extend_from_slice(b"first bytes");
        decoder.accept(&wire);
        let error = decoder.next_frame().unwrap_err();
        assert!(error.0.contains("cannot allocate"), "{}", error.0);
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
