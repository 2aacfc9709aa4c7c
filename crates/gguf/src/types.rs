//! The ggml tensor types a GGUF file may name, and the one table of facts about them.
//!
//! A ggml type stores a row as a sequence of *blocks*: `block_len` values packed into
//! `block_bytes` bytes. Every size computation in synapse goes through [`GgmlType::traits`];
//! no other place repeats these numbers. The codecs (dequantizers, activation quantizers, dot
//! products) live in the `synapse-quant` crate, which keys its own table by this type.
//!
//! Ids and sizes are ggml's (`ggml.h`, `enum ggml_type`, and `type_traits` in `ggml.c`).

use std::fmt;

/// Facts about one ggml type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeTraits {
    /// ggml's name, as `ggml_type_name` prints it (`"q4_K"` style is ggml's; we print upper case).
    pub name: &'static str,
    /// Values per block.
    pub block_len: usize,
    /// Bytes per block.
    pub block_bytes: usize,
}

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $block_len:literal, $block_bytes:literal; )*) => {
        /// A ggml tensor type, by its on-disk id.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u32)]
        pub enum GgmlType {
            $( $variant = $id, )*
        }

        impl GgmlType {
            /// Every type this build knows, in id order.
            pub const ALL: &'static [GgmlType] = &[$( GgmlType::$variant, )*];

            /// The type with this on-disk id, if the id is one ggml defines.
            pub const fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $( $id => Some(GgmlType::$variant), )*
                    _ => None,
                }
            }

            /// The facts about this type.
            pub const fn traits(self) -> &'static TypeTraits {
                match self {
                    $( GgmlType::$variant => &TypeTraits {
                        name: $name,
                        block_len: $block_len,
                        block_bytes: $block_bytes,
                    }, )*
                }
            }
        }
    };
}

// variant = id, name, values per block, bytes per block
ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2_K = 10, "Q2_K", 256, 84;
    Q3_K = 11, "Q3_K", 256, 110;
    Q4_K = 12, "Q4_K", 256, 144;
    Q5_K = 13, "Q5_K", 256, 176;
    Q6_K = 14, "Q6_K", 256, 210;
    Q8_K = 15, "Q8_K", 256, 292;
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    IQ1_S = 19, "IQ1_S", 256, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", 256, 110;
    IQ2_S = 22, "IQ2_S", 256, 82;
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", 256, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", 256, 54;
    TQ2_0 = 35, "TQ2_0", 256, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
}

impl GgmlType {
    /// The on-disk id.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name for the type.
    pub const fn name(self) -> &'static str {
        self.traits().name
    }

    /// Values per block.
    pub const fn block_len(self) -> usize {
        self.traits().block_len
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        self.traits().block_bytes
    }

    /// The type with this name (case-insensitive), for command lines.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Bytes taken by `n` values, or `None` if `n` is not a whole number of blocks or the size
    /// overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let t = self.traits();
        if !n.is_multiple_of(t.block_len as u64) {
            return None;
        }
        (n / t.block_len as u64).checked_mul(t.block_bytes as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_names_are_unique() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
            assert_eq!(GgmlType::from_name(&t.name().to_lowercase()), Some(t));
        }
        // Ids ggml removed (Q4_2, Q4_3 and the repacked Q4_0_4_4 family) stay unknown.
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 1000] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
    }

    #[test]
    fn bytes_for_checks_blocks_and_overflow() {
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
        assert_eq!(GgmlType::Q8_0.bytes_for(0), Some(0));
    }
}
