//! Entry points for the fuzz targets in `fuzz/` (`scripts/fuzz.sh`): each
//! runs untrusted input through the code weir runs it through. Not an API:
//! hidden from the docs, and may change with the code it reaches.

use prost::Message;
use weir_core::security::acl::AclFile;
use weir_core::security::gate::{StreamGate, TokenFile};
use weir_core::security::passwd::PasswordFile;
use weir_core::ClassId;
use weir_proto::pb;

/// The MQTT listen-mode packet path (see `ingress::mqtt::listen`).
pub fn mqtt_ingress(data: &[u8]) {
    crate::ingress::mqtt::listen::fuzz(data);
}

/// What a peer sends: each peer message type decoded, and its records
/// converted as the peer service converts them.
pub fn peer_messages(data: &[u8]) {
    if let Ok(req) = pb::ForwardRequest::decode(data) {
        for r in req.records {
            let _ = crate::peer::from_pb(r, ClassId(0));
        }
    }
    if let Ok(req) = pb::HeartbeatRequest::decode(data) {
        if let Some(state) = req.state {
            let _ = crate::peer::sanitized_tuple(state.tuple, 3);
        }
    }
    let _ = pb::ReserveRequest::decode(data);
    let _ = pb::ForwardAck::decode(data);
}

/// Password, ACL and token files, and checks against what they hold.
pub fn auth_files(text: &str) {
    let (passwords, _) = PasswordFile::parse(text);
    // A cheap check only: `$7$` lines may ask for up to 10 million rounds.
    let _ = passwords.len();
    let (acl, _) = AclFile::parse(text);
    for (user, client) in [(None, "c"), (Some("u"), "c/+"), (Some("a#"), "x")] {
        if acl.identity_problem(user, client).is_none() {
            let client_acl = acl.for_client(user, client);
            for topic in ["a", "a/b", "$SYS/x", "u/c", ""] {
                let _ = client_acl.may_publish(topic);
            }
        }
    }
    let (tokens, _) = TokenFile::parse(text);
    let gate = StreamGate {
        tokens: Some(tokens),
        allow: None,
        allow_anonymous: false,
    };
    let _ = gate.admit(None, Some(text.lines().next().unwrap_or_default()));
}
