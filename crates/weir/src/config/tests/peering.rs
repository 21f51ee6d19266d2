//! The `[peering]` section: defaults, adverts, mistakes, mutual TLS.

use super::*;

#[test]
fn peering_is_off_unless_listen_is_given() {
    assert_eq!(parse("", "t").unwrap().peering, None);
    assert_eq!(
        parse("[peering]\nheartbeat = \"50ms\"", "t")
            .unwrap()
            .peering,
        None
    );
    let c = parse(
        r#"
        [node]
        id = 1
        [peering]
        listen = "127.0.0.1:7070"
        peers = [{ id = 2, addr = "10.0.0.2:7070" }, { id = 3, addr = "edge-3.local:7070" }]
        dead_after = "1s"
        "#,
        "t",
    )
    .unwrap();
    let p = c.peering.unwrap();
    assert_eq!(p.listen, "127.0.0.1:7070".parse().unwrap());
    assert_eq!(p.peers.len(), 2);
    assert_eq!(p.peers[1].id, 3);
    assert_eq!(p.peers[1].addr.to_string(), "edge-3.local:7070");
    assert_eq!(p.heartbeat, defaults::PEER_HEARTBEAT);
    assert_eq!(p.heartbeat_jitter, defaults::PEER_HEARTBEAT_JITTER);
    assert_eq!(p.dead_after, Duration::from_secs(1));
    assert_eq!(p.lease, defaults::PEER_LEASE);
}

#[test]
fn peering_adverts_by_gossip_have_their_own_defaults_and_checks() {
    let base = r#"
        [node]
        id = 1
        [peering]
        listen = "127.0.0.1:7070"
        peers = [{ id = 2, addr = "10.0.0.2:7070" }]
        "#;
    let p = parse(base, "t").unwrap().peering.unwrap();
    assert_eq!(p.adverts, Adverts::AllToAll);
    assert_eq!(p.dead_after, defaults::PEER_DEAD_AFTER);
    let p = parse(&format!("{base}adverts = \"gossip\""), "t")
        .unwrap()
        .peering
        .unwrap();
    let gossip = |fanout, ms| Adverts::Gossip {
        fanout,
        every: Duration::from_millis(ms),
    };
    assert_eq!(p.adverts, gossip(2, 1000));
    assert_eq!(p.dead_after, Duration::from_secs(6), "six gossip periods");
    let p = parse(
        &format!("{base}adverts = \"gossip\"\ngossip_fanout = 3\ngossip_every = \"500ms\""),
        "t",
    )
    .unwrap()
    .peering
    .unwrap();
    assert_eq!(p.adverts, gossip(3, 500));
    assert_eq!(p.dead_after, Duration::from_secs(3));

    let ps = problems(&format!("{base}adverts = \"rumour\""));
    assert_problem(
        &ps,
        "peering.adverts",
        "not one of \"all-to-all\", \"gossip\"",
    );
    let ps = problems(&format!("{base}gossip_fanout = 2\ngossip_every = \"1s\""));
    assert_problem(
        &ps,
        "peering.gossip_fanout",
        "only used with adverts = \"gossip\"",
    );
    assert_problem(
        &ps,
        "peering.gossip_every",
        "only used with adverts = \"gossip\"",
    );
    let ps = problems(&format!(
        "{base}adverts = \"gossip\"\ngossip_fanout = 0\ngossip_every = \"0s\""
    ));
    assert_problem(&ps, "peering.gossip_fanout", "0 is not within 1..=64");
    assert_problem(&ps, "peering.gossip_every", "");
    let ps = problems(&format!("{base}adverts = \"gossip\"\ndead_after = \"2s\""));
    assert_problem(&ps, "peering.dead_after", "longer than two gossip periods");
}

#[test]
fn peering_mistakes_are_reported_with_their_key_paths() {
    let ps = problems(
        r#"
        [node]
        id = 4
        [peering]
        listen = "nowhere"
        peers = [
            { id = 2, addr = "10.0.0.2:7070" },
            { id = 2, addr = "10.0.0.3:7070" },
            { id = 4, addr = "10.0.0.4:7070" },
            { id = 0, addr = "10.0.0.5" },
            { addr = "http://10.0.0.6:7070" },
        ]
        heartbeat = "200ms"
        heartbeat_jitter = 0.6
        dead_after = "200ms"
        lease = "100ms"
        "#,
    );
    assert_problem(
        &ps,
        "peering.heartbeat_jitter",
        "0.6 is not within 0.0..=0.45",
    );
    assert_problem(&ps, "peering.listen", "not an IP address and port");
    assert_problem(
        &ps,
        "peering.peers[1].id",
        "already the id of peering.peers[0]",
    );
    assert_problem(&ps, "peering.peers[2].id", "this node's own node.id");
    assert_problem(&ps, "peering.peers[3].id", "0 is reserved");
    assert_problem(&ps, "peering.peers[3].addr", "expected host:port");
    assert_problem(&ps, "peering.peers[4].id", "missing");
    assert_problem(&ps, "peering.peers[4].addr", "without a scheme");
    assert_problem(
        &ps,
        "peering.dead_after",
        "must be longer than peering.heartbeat",
    );
    assert_problem(
        &ps,
        "peering.lease",
        "must be longer than peering.heartbeat",
    );

    assert_problem(
        &problems("[peering]\npeers = [{ id = 2, addr = \"10.0.0.2:7070\" }]"),
        "peering.listen",
        "missing",
    );
    assert_problem(
        &problems("[peering]\nlisten = \"0.0.0.0:7070\"\nheartbeat = \"0s\""),
        "peering.heartbeat",
        "greater than zero",
    );
    assert_problem(
        &problems("[peering]\nlisten = \"127.0.0.1:50051\""),
        "peering.listen",
        "clashes with ingress.grpc.listen",
    );
    let (_, message) = toml_error("[peering]\npeers = [{ id = 2, address = \"x:1\" }]");
    assert!(message.contains("address"), "{message}");
}

#[test]
fn peering_over_the_network_needs_mutual_tls() {
    let ps = problems("[peering]\nlisten = \"0.0.0.0:7070\"");
    assert_problem(&ps, "peering.listen", "[peering.tls]");
    assert_problem(&ps, "peering.listen", "peering.allow_anonymous = true");
    parse(
        "[peering]\nlisten = \"0.0.0.0:7070\"\nallow_anonymous = true",
        "t",
    )
    .unwrap();
    let c = parse(
        "[peering]\nlisten = \"0.0.0.0:7070\"\n[peering.tls]\ncertfile = \"n.pem\"\nkeyfile = \"n.key\"\ncafile = \"ca.pem\"",
        "t",
    )
    .unwrap();
    let tls = c.peering.unwrap().tls.unwrap();
    assert!(tls.require_certificate, "peering TLS is always mutual");
    let ps = problems(
        "[peering]\nlisten = \"127.0.0.1:7070\"\n[peering.tls]\ncertfile = \"n.pem\"\nkeyfile = \"n.key\"\nrequire_certificate = false",
    );
    assert_problem(&ps, "peering.tls.cafile", "missing");
    assert_problem(&ps, "peering.tls.require_certificate", "always mutual");
}
