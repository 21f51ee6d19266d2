//! Who may connect and publish, decided from Mosquitto-compatible files:
//! password files ([`passwd`]), topic ACLs ([`acl`]), and the decision
//! at the MQTT listener's door ([`gate`]). docs/security.md.

pub mod acl;
pub mod gate;
pub mod passwd;
