//! Password, ACL and token files: any text is read into entries and a
//! list of bad lines, never a panic; whatever is read answers checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        weir::fuzzing::auth_files(text);
    }
});
