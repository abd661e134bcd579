//! [`Plain`]: plain-old-data arguments and results, moved as their bytes.

use serde::de::Visitor;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A plain-old-data value (`bytemuck::Pod`: numbers, arrays of them, `#[repr(C)]` structs of
/// them) as a procedure's arguments or result: its bytes as they lie in memory, copied once into
/// the frame, instead of postcard's field-by-field encoding. Both ends must share the byte order
/// (true on one host and across x86/ARM farms).
///
/// ```
/// use ferromq_rpc::{Plain, Procedure};
/// struct Scale;
/// impl Procedure for Scale {
///     const NAME: &'static str = "scale";
///     type Args = Plain<[f32; 4]>;
///     type Output = Plain<[f32; 4]>;
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Plain<T>(pub T);

impl<T: bytemuck::Pod> Serialize for Plain<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytemuck::bytes_of(&self.0))
    }
}

impl<'de, T: bytemuck::Pod> Deserialize<'de> for Plain<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bytes<T>(std::marker::PhantomData<T>);
        impl<T: bytemuck::Pod> Visitor<'_> for Bytes<T> {
            type Value = Plain<T>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(
                    formatter,
                    "the {} bytes of a {}",
                    std::mem::size_of::<T>(),
                    std::any::type_name::<T>()
                )
            }

            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Plain<T>, E> {
                if bytes.len() != std::mem::size_of::<T>() {
                    return Err(E::invalid_length(bytes.len(), &self));
                }
                Ok(Plain(bytemuck::pod_read_unaligned(bytes)))
            }
        }
        deserializer.deserialize_bytes(Bytes(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::Plain;

    #[test]
    fn plain_values_travel_as_their_bytes_and_a_wrong_length_is_an_error() {
        let value = Plain([1.5f32, -2.0, 3.25, 0.0]);
        let bytes = postcard::to_allocvec(&value).unwrap();
        assert_eq!(bytes.len(), 1 + 16, "a length byte and the 16 bytes");
        assert_eq!(
            postcard::from_bytes::<Plain<[f32; 4]>>(&bytes).unwrap(),
            value
        );
        let error = postcard::from_bytes::<Plain<[f32; 8]>>(&bytes).unwrap_err();
        assert!(!error.to_string().is_empty());
    }
}
