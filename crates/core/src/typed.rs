//! Typed channels: [`Sender<T>`] and [`Receiver<T>`] over byte messages.
//!
//! The codec is chosen by the type through [`Encode`] and [`Decode`] ([`Payload`] is both):
//!
//! | type | encoding | copies |
//! |---|---|---|
//! | [`Message`], `Vec<u8>`, [`Bytes`] | none (raw bytes) | none |
//! | `String` | UTF-8 bytes, checked on receipt | none |
//! | [`Json<T>`] | serde_json | encode and decode |
//! | [`Postcard<T>`] | postcard (compact binary serde) | encode and decode |
//! | [`Pod<T>`] | the struct's own bytes (bytemuck) | one struct-sized copy each way |
//!
//! A decode error names the channel and leaves the channel usable for the next message.

use std::marker::PhantomData;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{CodecError, Error, Result, SendError};
use crate::message::Message;
use crate::transport::Channel;

/// A value that can be sent as one message; the implementing type picks the codec.
pub trait Encode: Sized + Send + 'static {
    /// Encodes the value.
    ///
    /// # Errors
    /// The codec's error.
    fn encode(self) -> Result<Message, CodecError>;
}

/// A value that can be read from one received message; the implementing type picks the codec.
pub trait Decode: Sized + Send + 'static {
    /// Decodes a received message.
    ///
    /// # Errors
    /// The codec's error.
    fn decode(message: Message) -> Result<Self, CodecError>;
}

/// A value that travels both ways.
pub trait Payload: Encode + Decode {}

impl<T: Encode + Decode> Payload for T {}

impl Encode for Message {
    fn encode(self) -> Result<Message, CodecError> {
        Ok(self)
    }
}

impl Decode for Message {
    fn decode(message: Message) -> Result<Self, CodecError> {
        Ok(message)
    }
}

impl Encode for Vec<u8> {
    fn encode(self) -> Result<Message, CodecError> {
        Ok(Message::from(self))
    }
}

impl Decode for Vec<u8> {
    fn decode(message: Message) -> Result<Self, CodecError> {
        Ok(message.into_bytes().into())
    }
}

impl Encode for Bytes {
    fn encode(self) -> Result<Message, CodecError> {
        Ok(Message::from(self))
    }
}

impl Decode for Bytes {
    fn decode(message: Message) -> Result<Self, CodecError> {
        Ok(message.into_bytes())
    }
}

impl Encode for String {
    fn encode(self) -> Result<Message, CodecError> {
        Ok(Message::from(self))
    }
}

impl Decode for String {
    fn decode(message: Message) -> Result<Self, CodecError> {
        let bytes: Vec<u8> = message.into_bytes().into();
        String::from_utf8(bytes).map_err(|error| CodecError::Utf8(error.utf8_error()))
    }
}

/// A serde value encoded as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Json<T>(pub T);

impl<T: Serialize + Send + 'static> Encode for Json<T> {
    fn encode(self) -> Result<Message, CodecError> {
        serde_json::to_vec(&self.0)
            .map(Message::from)
            .map_err(CodecError::Json)
    }
}

impl<T: DeserializeOwned + Send + 'static> Decode for Json<T> {
    fn decode(message: Message) -> Result<Self, CodecError> {
        serde_json::from_slice(message.data())
            .map(Json)
            .map_err(CodecError::Json)
    }
}

/// A serde value encoded with postcard, a compact binary format.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Postcard<T>(pub T);

impl<T: Serialize + Send + 'static> Encode for Postcard<T> {
    fn encode(self) -> Result<Message, CodecError> {
        postcard::to_stdvec(&self.0)
            .map(Message::from)
            .map_err(CodecError::Postcard)
    }
}

impl<T: DeserializeOwned + Send + 'static> Decode for Postcard<T> {
    fn decode(message: Message) -> Result<Self, CodecError> {
        postcard::from_bytes(message.data())
            .map(Postcard)
            .map_err(CodecError::Postcard)
    }
}

/// A plain-old-data struct sent as its own bytes, with no encoding.
///
/// The byte order is the host's: both ends must share it (true on one host and on x86/ARM farms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pod<T>(pub T);

impl<T: bytemuck::Pod + Send> Encode for Pod<T> {
    fn encode(self) -> Result<Message, CodecError> {
        Ok(Message::from(bytemuck::bytes_of(&self.0).to_vec()))
    }
}

impl<T: bytemuck::Pod + Send> Decode for Pod<T> {
    fn decode(message: Message) -> Result<Self, CodecError> {
        let expected = std::mem::size_of::<T>();
        if message.len() != expected {
            return Err(CodecError::PodSize {
                type_name: std::any::type_name::<T>(),
                expected,
                actual: message.len(),
            });
        }
        Ok(Pod(bytemuck::pod_read_unaligned(message.data())))
    }
}

/// The sending half of a typed channel.
#[derive(Debug)]
pub struct Sender<T> {
    channel: Channel,
    payload: PhantomData<fn(T)>,
}

impl<T: Encode> Sender<T> {
    /// Wraps a channel.
    pub fn new(channel: Channel) -> Self {
        Sender {
            channel,
            payload: PhantomData,
        }
    }

    /// Encodes and sends `value`.
    ///
    /// # Errors
    /// [`Error::Codec`] when encoding failed, or the channel's send error. The encoded message
    /// is dropped on failure; use [`Channel::send`] to keep it.
    pub async fn send(&mut self, value: T) -> Result<()> {
        let message = self.encode(value)?;
        self.channel
            .send(message)
            .await
            .map_err(SendError::into_error)
    }

    /// Encodes and sends `value`, waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`Sender::send`], and [`Error::Timeout`].
    pub async fn send_timeout(&mut self, value: T, timeout: Duration) -> Result<()> {
        let message = self.encode(value)?;
        self.channel
            .send_timeout(message, timeout)
            .await
            .map_err(SendError::into_error)
    }

    fn encode(&self, value: T) -> Result<Message> {
        value.encode().map_err(|source| Error::Codec {
            channel: self.channel.label().clone(),
            source,
        })
    }

    /// The channel underneath.
    pub fn channel(&mut self) -> &mut Channel {
        &mut self.channel
    }

    /// Gives the channel back.
    pub fn into_channel(self) -> Channel {
        self.channel
    }
}

/// The receiving half of a typed channel.
#[derive(Debug)]
pub struct Receiver<T> {
    channel: Channel,
    payload: PhantomData<fn() -> T>,
}

impl<T: Decode> Receiver<T> {
    /// Wraps a channel.
    pub fn new(channel: Channel) -> Self {
        Receiver {
            channel,
            payload: PhantomData,
        }
    }

    /// Receives and decodes one value.
    ///
    /// # Errors
    /// The channel's receive error, or [`Error::Codec`] (the channel stays usable).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn receive(&mut self) -> Result<T> {
        let message = self.channel.receive().await?;
        self.decode(message)
    }

    /// Receives and decodes one value, waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`Receiver::receive`], and [`Error::Timeout`].
    pub async fn receive_timeout(&mut self, timeout: Duration) -> Result<T> {
        let message = self.channel.receive_timeout(timeout).await?;
        self.decode(message)
    }

    fn decode(&self, message: Message) -> Result<T> {
        T::decode(message).map_err(|source| Error::Codec {
            channel: self.channel.label().clone(),
            source,
        })
    }

    /// The channel underneath.
    pub fn channel(&mut self) -> &mut Channel {
        &mut self.channel
    }

    /// Gives the channel back.
    pub fn into_channel(self) -> Channel {
        self.channel
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    struct Header {
        id: u64,
        size: u32,
        flags: u32,
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Event {
        id: u64,
        name: String,
    }

    fn round_trip<T: Payload>(value: T) -> T {
        T::decode(value.encode().unwrap()).unwrap()
    }

    #[test]
    fn every_codec_round_trips() {
        let event = || Event {
            id: 7,
            name: "tf".into(),
        };
        assert_eq!(round_trip(Json(event())).0, event());
        assert_eq!(round_trip(Postcard(event())).0, event());
        let header = Header {
            id: 1,
            size: 2,
            flags: 3,
        };
        assert_eq!(round_trip(Pod(header)).0, header);
        assert_eq!(round_trip(String::from("text")), "text");
        assert_eq!(round_trip(vec![1u8, 2]), vec![1, 2]);
        assert_eq!(
            round_trip(Bytes::from_static(b"raw")),
            Bytes::from_static(b"raw")
        );
    }

    #[test]
    fn postcard_is_more_compact_than_json() {
        let json = Json(Event {
            id: 7,
            name: "tf".into(),
        })
        .encode()
        .unwrap();
        let postcard = Postcard(Event {
            id: 7,
            name: "tf".into(),
        })
        .encode()
        .unwrap();
        assert!(
            postcard.len() < json.len(),
            "{} vs {}",
            postcard.len(),
            json.len()
        );
    }

    #[test]
    fn decode_errors_are_typed() {
        let wrong_size = Pod::<Header>::decode(Message::from(vec![0u8; 3])).unwrap_err();
        assert!(
            matches!(
                wrong_size,
                CodecError::PodSize {
                    expected: 16,
                    actual: 3,
                    ..
                }
            ),
            "{wrong_size}"
        );
        assert!(matches!(
            Json::<Event>::decode(Message::from("{")),
            Err(CodecError::Json(_))
        ));
        assert!(matches!(
            String::decode(Message::from(vec![0xff])),
            Err(CodecError::Utf8(_))
        ));
    }
}
