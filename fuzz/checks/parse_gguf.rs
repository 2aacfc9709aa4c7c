//! The GGUF parser, and the block decoders on whatever tensors a parsed file holds.
//!
//! The properties: no panic, no out-of-bounds access, no huge allocation (libFuzzer's
//! -rss_limit_mb catches those), and every tensor of a file that parses lies inside it.

use synapse_gguf::GgufFile;

pub fn check(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (_, v) in file.metadata().iter() {
        let _ = v.to_string();
    }
    for t in file.tensors() {
        assert_eq!(t.data.len() as u64, t.info.size);
        // Decoding is bounded by the tensor's bytes, which are bounded by the input.
        if t.info.n_elements() <= 1 << 16 {
            let _ = synapse_quant::dequantize(t.info.ggml_type, t.data);
        }
    }
}
