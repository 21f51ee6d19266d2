//! Batch decoding as a consumer (and `weir decode`) does it, under each
//! content encoding, with a small output cap: compression bombs must be
//! refused without being inflated past the cap.
#![no_main]

use libfuzzer_sys::fuzz_target;

/// Decoded bytes allowed: a bomb that expands beyond it must be refused.
const CAP: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    for encoding in ["identity", "gzip", "zstd"] {
        if let Ok(batch) = weir_proto::decode_batch(data, encoding, CAP) {
            let total: usize = batch.records.iter().map(|r| r.payload.len()).sum();
            assert!(total <= CAP, "{encoding}: {total} bytes decoded past the cap");
        }
    }
});
