use std::cell::Cell;
use std::rc::Rc;

use super::*;

/// A spool ticket the test makes durable when it likes.
#[derive(Debug, Clone, Default)]
struct Tick(Rc<Cell<bool>>);

impl Tick {
    fn sync(&self) {
        self.0.set(true);
    }
}

impl Durable for Tick {
    fn is_durable(&self) -> bool {
        self.0.get()
    }
}

const MAX: usize = 4;

fn connected(persistent: bool, now: Instant) -> State<Tick> {
    let mut s = State::new(MAX, now + Duration::from_secs(10));
    s.handle_connect(
        Some(Duration::from_secs(60)),
        Session::default(),
        persistent,
        now,
    );
    s
}

fn queued(s: &mut State<Tick>, qos: QoS, dup: bool, pkid: u16, payload: &[u8]) -> Queued {
    match s.handle_publish(qos, dup, pkid, b"t/a", payload).unwrap() {
        Publish::Queue(q) => q,
        Publish::Answered => panic!("publish {pkid} was answered, not queued"),
    }
}

fn drain(s: &mut State<Tick>) -> Vec<String> {
    std::iter::from_fn(|| s.poll_reply())
        .map(|r| format!("{r:?}"))
        .collect()
}

#[test]
fn a_resend_needs_dup_the_same_id_and_the_same_bytes() {
    let mut s = Session::<Tick>::default();
    let a = fingerprint(b"t/a", b"one");
    s.accepted(7, a, None);
    assert!(s.resend(true, 7, a).is_some());
    assert!(
        s.resend(false, 7, a).is_none(),
        "without DUP it is a new record"
    );
    assert!(s.resend(true, 8, a).is_none(), "another packet id");
    assert!(
        s.resend(true, 7, fingerprint(b"t/a", b"two")).is_none(),
        "the id reused for another publish"
    );
    assert!(s.resend(true, 7, fingerprint(b"t/b", b"one")).is_none());
}

#[test]
fn a_dup_resend_while_its_puback_is_held_is_not_queued() {
    let mut s = connected(false, Instant::now());
    let tick = Tick::default();
    let q = queued(&mut s, QoS::AtLeastOnce, false, 3, b"x");
    s.handle_queued(q, Some(tick.clone()));
    assert!(matches!(
        s.handle_publish(QoS::AtLeastOnce, true, 3, b"t/a", b"x"),
        Ok(Publish::Answered)
    ));
    assert!(s.poll_reply().is_none(), "the record is not durable yet");
    tick.sync();
    assert_eq!(drain(&mut s), ["PubAck(3)"], "one PUBACK answers both");
    // Once the PUBACK went out, a resend is a new record (not a persistent
    // session: nothing else remembers the id).
    queued(&mut s, QoS::AtLeastOnce, true, 3, b"x");
}

#[test]
fn a_persistent_session_resend_is_answered_not_queued() {
    let mut s = connected(true, Instant::now());
    let q = queued(&mut s, QoS::AtLeastOnce, false, 5, b"reading");
    s.handle_queued(q, None);
    assert_eq!(drain(&mut s), ["PubAck(5)"]);
    // The PUBACK was lost with the connection; the session comes back.
    let session = s.take_session().expect("persistent sessions are kept");
    let now = Instant::now();
    let mut again = State::new(MAX, now + Duration::from_secs(10));
    again.handle_connect(None, session, true, now);
    assert!(matches!(
        again.handle_publish(QoS::AtLeastOnce, true, 5, b"t/a", b"reading"),
        Ok(Publish::Answered)
    ));
    assert_eq!(drain(&mut again), ["PubAck(5)"]);
    // Without DUP, or with other bytes, it is a new record.
    queued(&mut again, QoS::AtLeastOnce, false, 5, b"reading");
    queued(&mut again, QoS::AtLeastOnce, true, 5, b"other");
    // A clean session keeps nothing.
    assert!(connected(false, now).take_session().is_none());
}

#[test]
fn a_qos2_resend_before_pubrel_is_not_queued() {
    let mut s = connected(false, Instant::now());
    let q = queued(&mut s, QoS::ExactlyOnce, false, 9, b"x");
    s.handle_queued(q, None);
    assert!(matches!(
        s.handle_publish(QoS::ExactlyOnce, true, 9, b"t/a", b"x"),
        Ok(Publish::Answered)
    ));
    s.handle_pubrel(9);
    assert_eq!(drain(&mut s), ["PubRec(9)", "PubRec(9)", "PubComp(9)"]);
    // After PUBREL the id is free for a new record.
    queued(&mut s, QoS::ExactlyOnce, false, 9, b"x");
    // A PUBREL for an id never seen is answered too.
    s.handle_pubrel(77);
    assert_eq!(drain(&mut s), ["PubComp(77)"]);
}

#[test]
fn the_receive_maximum_bounds_qos2_ids_and_reading() {
    let mut s = connected(false, Instant::now());
    let tick = Tick::default();
    for pkid in 1..=MAX as u16 {
        let q = queued(&mut s, QoS::ExactlyOnce, false, pkid, b"x");
        s.handle_queued(q, Some(tick.clone()));
        assert_eq!(s.can_read(), usize::from(pkid) < MAX, "after {pkid}");
    }
    assert!(matches!(
        s.handle_publish(QoS::ExactlyOnce, false, 99, b"t/a", b"x"),
        Err(ProtocolError::ReceiveMaximum(m)) if m == MAX
    ));
    tick.sync();
    assert_eq!(drain(&mut s).len(), MAX);
    assert!(s.can_read(), "the replies went out");
    // Still more than MAX awaiting PUBREL: the fifth is refused.
    assert!(s
        .handle_publish(QoS::ExactlyOnce, false, 99, b"t/a", b"x")
        .is_err());
    s.handle_pubrel(1);
    queued(&mut s, QoS::ExactlyOnce, false, 99, b"x");
}

#[test]
fn replies_leave_in_publish_order_behind_a_record_not_yet_durable() {
    let mut s = connected(false, Instant::now());
    let (first, third) = (Tick::default(), Tick::default());
    let q = queued(&mut s, QoS::AtLeastOnce, false, 1, b"a");
    s.handle_queued(q, Some(first.clone()));
    let q = queued(&mut s, QoS::AtLeastOnce, false, 2, b"b");
    s.handle_queued(q, None);
    let q = queued(&mut s, QoS::AtLeastOnce, false, 3, b"c");
    s.handle_queued(q, Some(third.clone()));
    s.reply(Reply::PingResp);
    assert!(s.poll_reply().is_none());
    assert!(s.poll_durable().is_some(), "waits on the first ticket");
    third.sync();
    assert!(s.poll_reply().is_none(), "the third waits for the first");
    first.sync();
    // Durable since the last look: still the one to wait on (a wait on it
    // ends at once), until the replies are handed out.
    assert!(s.poll_durable().is_some_and(Durable::is_durable));
    assert_eq!(
        drain(&mut s),
        ["PubAck(1)", "PubAck(2)", "PubAck(3)", "PingResp"]
    );
    assert!(s.poll_durable().is_none());
}

#[test]
fn a_ticket_durable_since_the_last_look_is_still_waited_on() {
    // The driver hands out what it can, then waits for the front's
    // ticket; if that ticket became durable in between, the wait must
    // still be there to end at once.
    let mut s = connected(false, Instant::now());
    let tick = Tick::default();
    let q = queued(&mut s, QoS::AtLeastOnce, false, 1, b"a");
    s.handle_queued(q, Some(tick.clone()));
    assert!(s.poll_reply().is_none());
    tick.sync();
    assert!(
        s.poll_durable().is_some(),
        "a reply that is ready is not left without a wake-up"
    );
}

#[test]
fn replies_of_records_never_durable_are_abandoned() {
    let mut s = connected(false, Instant::now());
    let q = queued(&mut s, QoS::AtLeastOnce, false, 1, b"a");
    s.handle_queued(q, Some(Tick::default()));
    s.abandon_replies();
    assert!(s.poll_reply().is_none());
    assert!(s.poll_durable().is_none());
}

#[test]
fn qos0_is_queued_and_never_answered() {
    let mut s = connected(true, Instant::now());
    let q = queued(&mut s, QoS::AtMostOnce, false, 0, b"a");
    s.handle_queued(q, Some(Tick::default()));
    assert!(s.poll_reply().is_none());
    assert!(s.poll_durable().is_none());
}

#[test]
fn the_connection_expires_at_its_connect_timeout_then_at_one_and_a_half_keep_alives() {
    let t0 = Instant::now();
    let mut s = State::<Tick>::new(MAX, t0 + Duration::from_secs(10));
    assert_eq!(
        s.poll_timeout(),
        Some((t0 + Duration::from_secs(10), Expiry::Connect))
    );
    // Bytes before CONNECT do not extend the connect timeout.
    s.heard(t0 + Duration::from_secs(5));
    assert_eq!(s.poll_timeout().unwrap().0, t0 + Duration::from_secs(10));
    let t1 = t0 + Duration::from_secs(1);
    let keep = Duration::from_secs(20);
    s.handle_connect(Some(keep), Session::default(), false, t1);
    assert_eq!(
        s.poll_timeout(),
        Some((t1 + Duration::from_secs(30), Expiry::KeepAlive(keep)))
    );
    let t2 = t1 + Duration::from_secs(29);
    s.heard(t2);
    assert_eq!(s.poll_timeout().unwrap().0, t2 + Duration::from_secs(30));
    // A client that asked for no keep alive never expires.
    let mut none = State::<Tick>::new(MAX, t0 + Duration::from_secs(10));
    none.handle_connect(None, Session::default(), false, t1);
    assert_eq!(none.poll_timeout(), None);
}

mod connect {
    use rumqttc::mqttbytes::v4;
    use rumqttc::v5::mqttbytes::v5;

    use super::*;

    fn peer() -> SocketAddr {
        "192.0.2.7:4000".parse().unwrap()
    }

    fn v311(client_id: &str, clean: bool) -> Hello {
        let mut c = v4::Connect::new(client_id);
        c.clean_session = clean;
        c.keep_alive = 0;
        Hello::V311(c)
    }

    fn v5(client_id: &str, properties: Option<v5::ConnectProperties>) -> Hello {
        Hello::V5(
            v5::Connect {
                keep_alive: 30,
                client_id: client_id.into(),
                clean_start: false,
                properties,
            },
            Some(v5::Login::new("u", "p")),
        )
    }

    #[test]
    fn a_client_without_an_id_gets_one_unless_its_311_session_is_to_be_kept() {
        let t = Terms::of(v311("", true), peer()).unwrap();
        assert_eq!(t.client_id, "weir-192.0.2.7:4000");
        assert_eq!(t.assigned, None, "MQTT 3.1.1 cannot tell the client");
        assert_eq!(t.keep_alive, None, "keep alive 0 is none");
        assert!(t.clean && !t.persistent);
        assert!(matches!(
            Terms::of(v311("", false), peer()),
            Err((
                Version::V311,
                Refusal::ClientId,
                ProtocolError::EmptyClientId
            ))
        ));
        let t = Terms::of(v5("", None), peer()).unwrap();
        assert_eq!(t.assigned.as_deref(), Some("weir-192.0.2.7:4000"));
        assert_eq!(t.client_id, "weir-192.0.2.7:4000");
        assert_eq!(t.login, Some(("u".into(), "p".into())));
    }

    #[test]
    fn a_session_outlives_the_connection_as_each_version_says() {
        let t = Terms::of(v311("dev", false), peer()).unwrap();
        assert!(!t.clean && t.persistent);
        // MQTT 5: only with a session expiry interval above zero.
        let t = Terms::of(v5("dev", None), peer()).unwrap();
        assert!(!t.clean && !t.persistent);
        assert_eq!(t.keep_alive, Some(Duration::from_secs(30)));
        let mut p = v5::ConnectProperties::new();
        p.session_expiry_interval = Some(60);
        assert!(Terms::of(v5("dev", Some(p)), peer()).unwrap().persistent);
    }

    #[test]
    fn an_authentication_method_is_refused() {
        let mut p = v5::ConnectProperties::new();
        p.authentication_method = Some("SCRAM-SHA-1".into());
        assert!(matches!(
            Terms::of(v5("dev", Some(p)), peer()),
            Err((Version::V5, Refusal::AuthMethod, ProtocolError::AuthMethod(m))) if m == "SCRAM-SHA-1"
        ));
    }
}
