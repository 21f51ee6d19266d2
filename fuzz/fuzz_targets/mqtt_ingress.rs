//! The MQTT listen-mode packet path: any bytes a client can send, framed
//! and parsed as weir does (CONNECT first, then packets in the version it
//! chose), with the topic checks. Must never panic or allocate without
//! bound; a bad packet is an error for that connection only.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    weir::fuzzing::mqtt_ingress(data);
});
