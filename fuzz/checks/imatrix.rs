//! The importance-matrix reader (GGUF and legacy `.dat`), as `synapse quantize --imatrix`
//! reads a file it is given.
//!
//! The properties: no panic, no out-of-bounds access, no allocation beyond the input's size
//! (a legacy entry's value count is checked against the bytes left before it is read), and a
//! matrix that reads holds only finite values.

use synapse_engine::quantize::imatrix::Imatrix;

pub fn check(data: &[u8]) {
    if let Ok(m) = Imatrix::from_bytes(data.to_vec()) {
        assert!(!m.entries.is_empty());
        for v in m.entries.values() {
            assert!(v.iter().all(|x| x.is_finite()));
        }
    }
}
