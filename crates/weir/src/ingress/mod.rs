//! Ingress: where records enter weir, MQTT in [`mqtt`] and gRPC in
//! [`grpc`]. Both enqueue through the shared [`crate::intake::Intake`] and
//! decide what its back-pressure means on their wire (withhold an MQTT
//! PUBACK, stop reading a socket, answer gRPC `RESOURCE_EXHAUSTED`).

pub mod grpc;
pub mod mqtt;
