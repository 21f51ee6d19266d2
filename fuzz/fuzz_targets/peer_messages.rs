//! What a peer can send: heartbeat states, reservation requests and
//! forwarded records, decoded and converted as the peer service does.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    weir::fuzzing::peer_messages(data);
});
