//! The config parser and validator: any text gives a config or a list of
//! problems, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = weir::config::parse(text, "fuzz.toml");
    }
});
