//! Listeners other hosts reach, TLS and authentication keys, gRPC tokens.

use super::*;

#[test]
fn listeners_other_hosts_reach_need_authentication() {
    // The defaults listen on loopback only, with anyone allowed there.
    let c = parse("", "t").unwrap();
    let MqttMode::Listen(l) = &c.ingress.mqtt.as_ref().unwrap().mode else {
        panic!("listen mode")
    };
    assert!(l.addr.unwrap().ip().is_loopback() && l.auth.allow_anonymous);

    // Every interface without authentication: refused, naming the key.
    let ps = problems(
        "[ingress.mqtt]\nlisten = \"0.0.0.0:1883\"\n[ingress.grpc]\nlisten = \"0.0.0.0:50051\"",
    );
    assert_problem(
        &ps,
        "ingress.mqtt.listen",
        "ingress.mqtt.allow_anonymous = true",
    );
    assert_problem(&ps, "ingress.mqtt.listen", "password_file");
    assert_problem(
        &ps,
        "ingress.grpc.listen",
        "ingress.grpc.allow_anonymous = true",
    );

    // An explicit allow_anonymous opens it.
    let c = parse(
        "[ingress.mqtt]\nlisten = \"0.0.0.0:1883\"\nallow_anonymous = true\n[ingress.grpc]\nlisten = \"0.0.0.0:50051\"\nallow_anonymous = true",
        "t",
    )
    .unwrap();
    let MqttMode::Listen(l) = &c.ingress.mqtt.as_ref().unwrap().mode else {
        panic!("listen mode")
    };
    assert!(l.auth.allow_anonymous);

    // A password file authenticates; anonymous clients are then refused
    // unless allowed.
    let c = parse(
        "[ingress.mqtt]\nlisten = \"0.0.0.0:1883\"\npassword_file = \"/etc/weir/passwd\"\nacl_file = \"/etc/weir/acl\"",
        "t",
    )
    .unwrap();
    let MqttMode::Listen(l) = &c.ingress.mqtt.as_ref().unwrap().mode else {
        panic!("listen mode")
    };
    assert_eq!(
        l.auth,
        MqttAuth {
            allow_anonymous: false,
            password_file: Some("/etc/weir/passwd".into()),
            acl_file: Some("/etc/weir/acl".into()),
        }
    );

    // Over TLS, required client certificates authenticate that listener
    // only; the plain one stays on loopback.
    let tls = "certfile = \"s.pem\"\nkeyfile = \"s.key\"\ncafile = \"ca.pem\"\nrequire_certificate = true\nlisten = \"0.0.0.0:8883\"";
    let c = parse(
        &format!("[ingress.mqtt]\nlisten = \"off\"\n[ingress.mqtt.tls]\n{tls}"),
        "t",
    )
    .unwrap();
    let MqttMode::Listen(l) = &c.ingress.mqtt.as_ref().unwrap().mode else {
        panic!("listen mode")
    };
    assert_eq!(l.addr, None);
    let t = l.tls.as_ref().unwrap();
    assert_eq!(t.listen, "0.0.0.0:8883".parse().unwrap());
    assert!(t.files.require_certificate);
    let ps = problems(&format!(
        "[ingress.mqtt]\nlisten = \"0.0.0.0:1883\"\n[ingress.mqtt.tls]\n{tls}"
    ));
    assert_problem(&ps, "ingress.mqtt.listen", "allow_anonymous");
    assert!(
        !ps.iter().any(|p| p.path == "ingress.mqtt.tls.listen"),
        "{ps:?}"
    );
    let ps = problems(
        "[ingress.mqtt.tls]\nlisten = \"0.0.0.0:8883\"\ncertfile = \"s.pem\"\nkeyfile = \"s.key\"",
    );
    assert_problem(&ps, "ingress.mqtt.tls.listen", "require_certificate");
}

#[test]
fn tls_and_auth_keys_are_checked() {
    let ps =
        problems("[ingress.mqtt]\nlisten = \"off\"\nallow_anonymous = false\npassword_file = \"\"");
    assert_problem(&ps, "ingress.mqtt.password_file", "must not be empty");
    let ps = problems("[ingress.mqtt]\nlisten = \"off\"");
    assert_problem(&ps, "ingress.mqtt.listen", "leaves no MQTT listener");
    let ps = problems("[ingress.mqtt]\nallow_anonymous = false");
    assert_problem(&ps, "ingress.mqtt.allow_anonymous", "nobody could");
    let ps =
        problems("[ingress.mqtt.tls]\nrequire_certificate = true\nuse_identity_as_username = true");
    assert_problem(&ps, "ingress.mqtt.tls.certfile", "missing");
    assert_problem(&ps, "ingress.mqtt.tls.keyfile", "missing");
    assert_problem(&ps, "ingress.mqtt.tls.require_certificate", "cafile");
    let ps = problems(
        "[ingress.mqtt.tls]\ncertfile = \"a\"\nkeyfile = \"b\"\nuse_identity_as_username = true",
    );
    assert_problem(
        &ps,
        "ingress.mqtt.tls.use_identity_as_username",
        "require_certificate = true",
    );
    let ps = problems(
        "[ingress.mqtt]\nmode = \"subscribe\"\npassword_file = \"p\"\n[ingress.mqtt.tls]\ncertfile = \"a\"\nkeyfile = \"b\"",
    );
    assert_problem(
        &ps,
        "ingress.mqtt.password_file",
        "only used when mode = \"listen\"",
    );
    assert_problem(&ps, "ingress.mqtt.tls", "only used when mode = \"listen\"");
    // The two MQTT listeners clash like any others.
    let ps = problems(
        "[ingress.mqtt.tls]\nlisten = \"127.0.0.1:1883\"\ncertfile = \"a\"\nkeyfile = \"b\"",
    );
    assert_problem(
        &ps,
        "ingress.mqtt.tls.listen",
        "clashes with ingress.mqtt.listen",
    );
}

#[test]
fn grpc_tokens_allow_lists_and_tls_are_checked() {
    let c = parse(
        "[ingress.grpc]\nlisten = \"0.0.0.0:50051\"\ntokens_file = \"/etc/weir/tokens\"\n[ingress.grpc.allow]\ngw1 = [\"line1/*\", \"alarms\"]",
        "t",
    )
    .unwrap();
    let g = c.ingress.grpc.unwrap();
    assert!(
        !g.auth.allow_anonymous,
        "a token file turns anonymous callers away"
    );
    assert_eq!(g.auth.allow.unwrap()["gw1"], vec!["line1/*", "alarms"]);
    let ps = problems("[ingress.grpc.allow]\ngw1 = [\"a*b\"]");
    assert_problem(&ps, "ingress.grpc.allow.\"gw1\"", "may only end a pattern");
    let ps =
        problems("[ingress.grpc.tls]\ncertfile = \"a\"\nkeyfile = \"b\"\nlisten = \"127.0.0.1:1\"");
    assert_problem(&ps, "ingress.grpc.tls.listen", "not used in this section");
    parse(
        "[ingress.grpc]\nlisten = \"0.0.0.0:50051\"\n[ingress.grpc.tls]\ncertfile = \"a\"\nkeyfile = \"b\"\ncafile = \"c\"\nrequire_certificate = true",
        "t",
    )
    .unwrap();
}
