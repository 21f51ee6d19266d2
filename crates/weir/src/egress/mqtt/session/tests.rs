use super::*;

fn publishes(n: usize) -> Vec<(String, Bytes)> {
    (0..n)
        .map(|i| (format!("t/{i}"), Bytes::from(format!("p{i}"))))
        .collect()
}

/// The packets encoded in `buf`, as the broker would read them.
fn sent(buf: &mut BytesMut) -> Vec<Packet> {
    let mut out = Vec::new();
    while let Some(p) = read_packet(buf, 1 << 20).unwrap() {
        out.push(p);
    }
    out
}

fn pkids(packets: &[Packet]) -> Vec<u16> {
    packets
        .iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(p.pkid),
            _ => None,
        })
        .collect()
}

#[test]
fn a_batch_is_confirmed_when_all_its_publishes_are() {
    let t0 = Instant::now();
    let mut s = Publisher::new(100, Duration::from_secs(30), t0);
    s.queue(7, publishes(3));
    let mut buf = BytesMut::new();
    assert!(s.write_to(&mut buf, 1 << 20, t0));
    let out = sent(&mut buf);
    assert_eq!(pkids(&out), vec![1, 2, 3]);
    match &out[1] {
        Packet::Publish(p) => {
            assert_eq!(p.topic, "t/1");
            assert_eq!(p.payload.as_ref(), b"p1");
            assert_eq!(p.qos, QoS::AtLeastOnce);
        }
        other => panic!("{other:?}"),
    }
    s.handle_packet(Packet::PubAck(PubAck::new(1))).unwrap();
    s.handle_packet(Packet::PubAck(PubAck::new(3))).unwrap();
    assert_eq!(s.poll_confirmed(), None);
    s.handle_packet(Packet::PubAck(PubAck::new(2))).unwrap();
    assert_eq!(s.poll_confirmed(), Some(7));
    assert_eq!(s.poll_confirmed(), None);
}

#[test]
fn no_more_than_max_in_flight_are_unacknowledged() {
    let t0 = Instant::now();
    let mut s = Publisher::new(2, Duration::ZERO, t0);
    s.queue(1, publishes(3));
    s.queue(2, publishes(1));
    let mut buf = BytesMut::new();
    s.write_to(&mut buf, 1 << 20, t0);
    assert_eq!(pkids(&sent(&mut buf)), vec![1, 2]);
    assert!(!s.write_to(&mut buf, 1 << 20, t0));
    s.handle_packet(Packet::PubAck(PubAck::new(2))).unwrap();
    assert!(s.write_to(&mut buf, 1 << 20, t0));
    assert_eq!(pkids(&sent(&mut buf)), vec![3]);
    s.handle_packet(Packet::PubAck(PubAck::new(1))).unwrap();
    s.handle_packet(Packet::PubAck(PubAck::new(3))).unwrap();
    assert_eq!(s.poll_confirmed(), Some(1));
    // Packet ids in use are skipped; freed ones come back in turn.
    s.write_to(&mut buf, 1 << 20, t0);
    assert_eq!(pkids(&sent(&mut buf)), vec![4]);
    s.handle_packet(Packet::PubAck(PubAck::new(4))).unwrap();
    assert_eq!(s.poll_confirmed(), Some(2));
}

#[test]
fn publishes_wait_for_a_quarter_of_the_window() {
    let t0 = Instant::now();
    let mut s = Publisher::new(8, Duration::ZERO, t0);
    s.queue(1, publishes(20));
    let mut buf = BytesMut::new();
    s.write_to(&mut buf, 1 << 20, t0);
    assert_eq!(pkids(&sent(&mut buf)), (1..=8).collect::<Vec<_>>());
    s.handle_packet(Packet::PubAck(PubAck::new(1))).unwrap();
    assert!(!s.write_to(&mut buf, 1 << 20, t0), "one free slot of 8");
    s.handle_packet(Packet::PubAck(PubAck::new(2))).unwrap();
    assert!(s.write_to(&mut buf, 1 << 20, t0), "two free slots of 8");
    assert_eq!(pkids(&sent(&mut buf)), vec![9, 10]);
}

#[test]
fn a_full_buffer_holds_the_rest_back() {
    let t0 = Instant::now();
    let mut s = Publisher::new(100, Duration::ZERO, t0);
    s.queue(1, publishes(10));
    let mut buf = BytesMut::new();
    s.write_to(&mut buf, 20, t0);
    assert_eq!(pkids(&sent(&mut buf)), vec![1, 2]);
    s.write_to(&mut buf, 1 << 20, t0);
    assert_eq!(pkids(&sent(&mut buf)), (3..=10).collect::<Vec<_>>());
    assert!(!s.write_to(&mut buf, 1 << 20, t0));
}

#[test]
fn packet_ids_wrap_past_65535_and_skip_those_in_flight() {
    let t0 = Instant::now();
    let mut s = Publisher::new(4, Duration::ZERO, t0);
    let mut buf = BytesMut::new();
    s.queue(1, publishes(1));
    s.write_to(&mut buf, 1 << 20, t0);
    assert_eq!(pkids(&sent(&mut buf)), vec![1]);
    // Id 1 stays unacknowledged while the ids go round.
    for round in 0..65_534u32 {
        s.queue(u64::from(round) + 2, publishes(1));
        s.write_to(&mut buf, 1 << 20, t0);
        let ids = pkids(&sent(&mut buf));
        assert_eq!(ids.len(), 1);
        s.handle_packet(Packet::PubAck(PubAck::new(ids[0])))
            .unwrap();
    }
    s.queue(99_999, publishes(1));
    s.write_to(&mut buf, 1 << 20, t0);
    assert_eq!(pkids(&sent(&mut buf)), vec![2]);
}

#[test]
fn an_empty_batch_is_confirmed_at_once() {
    let mut s = Publisher::new(1, Duration::ZERO, Instant::now());
    s.queue(3, Vec::new());
    assert_eq!(s.poll_confirmed(), Some(3));
}

#[test]
fn a_quiet_connection_pings_and_a_silent_broker_ends_it() {
    let t0 = Instant::now();
    let ka = Duration::from_secs(10);
    let mut s = Publisher::new(10, ka, t0);
    assert_eq!(s.poll_timeout(), Some(t0 + ka));
    let mut buf = BytesMut::new();
    s.handle_timeout(t0 + ka / 2).unwrap();
    assert!(!s.write_to(&mut buf, 1 << 20, t0 + ka / 2));
    s.handle_timeout(t0 + ka).unwrap();
    assert!(s.write_to(&mut buf, 1 << 20, t0 + ka));
    assert!(matches!(sent(&mut buf)[..], [Packet::PingReq]));
    assert_eq!(s.poll_timeout(), Some(t0 + ka + ka));
    // Answered: the next ping is a keep-alive after the last packet sent.
    s.handle_packet(Packet::PingResp).unwrap();
    assert_eq!(s.poll_timeout(), Some(t0 + ka + ka));
    s.handle_timeout(t0 + 2 * ka).unwrap();
    s.write_to(&mut buf, 1 << 20, t0 + 2 * ka);
    assert_eq!(
        s.handle_timeout(t0 + 3 * ka),
        Err(Broken::Silent(ka)),
        "an unanswered PINGREQ ends the connection"
    );
}

#[test]
fn publishing_puts_the_ping_off() {
    let t0 = Instant::now();
    let ka = Duration::from_secs(10);
    let mut s = Publisher::new(10, ka, t0);
    s.queue(1, publishes(1));
    let mut buf = BytesMut::new();
    s.write_to(&mut buf, 1 << 20, t0 + ka / 2);
    assert_eq!(s.poll_timeout(), Some(t0 + ka / 2 + ka));
    sent(&mut buf);
    s.handle_timeout(t0 + ka).unwrap();
    assert!(!s.write_to(&mut buf, 1 << 20, t0 + ka));
}

#[test]
fn what_the_broker_may_not_send_ends_the_connection() {
    let mut s = Publisher::new(10, Duration::ZERO, Instant::now());
    assert_eq!(
        s.handle_packet(Packet::ConnAck(ConnAck::new(
            rumqttc::mqttbytes::v4::ConnectReturnCode::Success,
            false
        ))),
        Err(Broken::Unexpected("CONNACK"))
    );
    let mut buf = BytesMut::from(&[0x40u8, 0x02, 0x00][..]);
    assert_eq!(read_packet(&mut buf, 1 << 20), Ok(None), "incomplete");
    let mut buf = BytesMut::from(&[0xf0u8, 0x00][..]);
    assert!(matches!(
        read_packet(&mut buf, 1 << 20),
        Err(Broken::Malformed(_))
    ));
}

#[test]
fn a_publish_from_an_earlier_session_is_acknowledged() {
    let t0 = Instant::now();
    let mut s = Publisher::new(10, Duration::ZERO, t0);
    let mut p = Publish::new("old/topic", QoS::AtLeastOnce, b"x".to_vec());
    p.pkid = 9;
    s.handle_packet(Packet::Publish(p)).unwrap();
    let mut buf = BytesMut::new();
    assert!(s.write_to(&mut buf, 1 << 20, t0));
    assert!(matches!(
        sent(&mut buf)[..],
        [Packet::PubAck(PubAck { pkid: 9 })]
    ));
}

#[test]
fn connect_carries_the_session_terms() {
    let hello = Hello {
        client_id: "weir-7".into(),
        keep_alive: Duration::from_secs(30),
        clean_session: false,
        login: Some(("u".into(), "pw".into())),
    };
    let mut buf = BytesMut::new();
    hello.write_to(&mut buf);
    match read_packet(&mut buf, 1 << 20).unwrap() {
        Some(Packet::Connect(c)) => {
            assert_eq!(c.client_id, "weir-7");
            assert_eq!(c.keep_alive, 30);
            assert!(!c.clean_session);
            assert_eq!(c.login.unwrap().username, "u");
        }
        other => panic!("{other:?}"),
    }
    let mut ack = BytesMut::new();
    ConnAck::new(rumqttc::mqttbytes::v4::ConnectReturnCode::Success, true)
        .write(&mut ack)
        .unwrap();
    let whole = ack.clone();
    let mut half = BytesMut::from(&whole[..2]);
    assert_eq!(read_connack(&mut half, 1024), Ok(None));
    assert!(
        read_connack(&mut ack, 1024)
            .unwrap()
            .unwrap()
            .session_present
    );
}

#[test]
fn a_connack_refusal_names_the_key_to_fix() {
    use rumqttc::mqttbytes::v4::ConnectReturnCode as C;
    assert_eq!(answer(C::Success), Answer::Accepted);
    assert_eq!(
        answer(C::BadUserNamePassword),
        Answer::Refused("egress.mqtt.username")
    );
    assert_eq!(
        answer(C::NotAuthorized),
        Answer::Refused("egress.mqtt.username")
    );
    assert_eq!(
        answer(C::BadClientId),
        Answer::Refused("egress.mqtt.client_id")
    );
    assert_eq!(answer(C::ServiceUnavailable), Answer::Unavailable);
}
