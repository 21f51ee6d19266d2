//! MQTT ingress, in one of two modes chosen by `ingress.mqtt.mode`.
//!
//! - `listen` ([`listen`]): devices connect to weir itself with any MQTT
//!   3.1.1 or 5 client (mosquitto_pub, paho, rumqttc). weir speaks the
//!   server side of the protocol with the packet codec rumqttc exposes
//!   (`rumqttc::mqttbytes::v4`, `rumqttc::v5::mqttbytes::v5`) rather than an
//!   embedded broker: a broker acknowledges a publish on receipt, while weir
//!   must withhold the PUBACK until the record is in its class queue.
//! - `subscribe`: weir is a client of an existing broker.
//!
//! Both hand records to the shared [`Intake`](crate::intake::Intake),
//! which classifies them by topic and applies back-pressure when a class
//! queue is full.
//!
//! # Layout
//! - [`listen`]: the accept loop and one task per device connection.

pub mod listen;
pub mod subscribe;
