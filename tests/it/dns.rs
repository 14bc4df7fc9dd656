//! `[dns] servers` is honoured: a tiny loopback DNS server answers for one name.

use std::net::UdpSocket;

use serde_json::Value;

use crate::origins;
use crate::support::{Daemon, Home, curl};

/// Answers `A <name>` with 127.0.0.1, everything else with NXDOMAIN.
pub fn dns_server(name: &'static str) -> u16 {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sock.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                continue;
            };
            let q = &buf[..n];
            if n < 12 {
                continue;
            }
            let mut i = 12;
            let mut labels = Vec::new();
            while i < n && q[i] != 0 {
                let len = q[i] as usize;
                labels.push(
                    String::from_utf8_lossy(&q[i + 1..(i + 1 + len).min(n)]).to_ascii_lowercase(),
                );
                i += 1 + len;
            }
            let question_end = (i + 5).min(n);
            let qtype = u16::from_be_bytes([q[(i + 1).min(n - 1)], q[(i + 2).min(n - 1)]]);
            let matched = labels.join(".") == name;
            let answer = matched && qtype == 1;
            let mut r = Vec::new();
            r.extend_from_slice(&q[0..2]);
            r.extend_from_slice(if matched {
                &[0x81, 0x80]
            } else {
                &[0x81, 0x83]
            });
            r.extend_from_slice(&[0, 1, 0, u8::from(answer), 0, 0, 0, 0]);
            r.extend_from_slice(&q[12..question_end]);
            if answer {
                r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 127, 0, 0, 1]);
            }
            let _ = sock.send_to(&r, peer);
        }
    });
    port
}

#[test]
fn names_resolve_through_the_configured_servers() {
    let origin = origins::responds("200 OK", &[], "resolved");
    let dns_port = dns_server("named.test");
    let home = Home::new();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [dns]\nservers = [\"127.0.0.1:{dns_port}\"]\n\
         [[routes]]\nid = \"named\"\nmatch = {{ scheme = \"http\", host = \"named.test\", port = {port} }}\nallow_private = true\nconnect_timeout = \"2s\"\n\
         [[routes]]\nid = \"missing\"\nmatch = {{ scheme = \"http\", host = \"missing.test\", port = {port} }}\nconnect_timeout = \"2s\"\n",
        port = origin.port()
    );
    let daemon = Daemon::start(&home, Some(&config));
    let (status, body, _) = curl(&[
        "-x",
        &daemon.proxy,
        &format!("http://named.test:{}/x", origin.port()),
    ]);
    assert_eq!((status, body.as_str()), (200, "resolved"));
    let (status, body, _) = curl(&[
        "-x",
        &daemon.proxy,
        &format!("http://missing.test:{}/x", origin.port()),
    ]);
    assert_eq!(status, 502, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["code"], "DNS_ERROR");
    assert_eq!(origin.hits(), 1);
}

#[test]
fn a_name_that_resolves_to_loopback_is_prohibited_without_allow_private() {
    let origin = origins::responds("200 OK", &[], "should not see this");
    let dns_port = dns_server("rebind.test");
    let home = Home::new();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [dns]\nservers = [\"127.0.0.1:{dns_port}\"]\n\
         [[routes]]\nid = \"rebind\"\nmatch = {{ scheme = \"http\", host = \"rebind.test\", port = {port} }}\nconnect_timeout = \"2s\"\n",
        port = origin.port()
    );
    let daemon = Daemon::start(&home, Some(&config));
    let (status, body, _) = curl(&[
        "-x",
        &daemon.proxy,
        &format!("http://rebind.test:{}/x", origin.port()),
    ]);
    assert_eq!(status, 502, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["code"], "DESTINATION_PROHIBITED");
    assert_eq!(e["evidence"]["attempts"][0]["stage"], "tcp_connect");
    assert_eq!(
        e["evidence"]["attempts"][0]["code"],
        "DESTINATION_PROHIBITED"
    );
    // Issue 40 (low 5): it names the fix, and the journal the address's class.
    let said = e.to_string();
    assert!(
        said.contains("allow_private") && said.contains("resolve"),
        "{said}"
    );
    let id = e["invocation_id"].as_str().unwrap_or_default();
    let (_, events) =
        crate::support::get_json(&daemon.url(&format!("/v1/invocations/{id}/events")), &[]);
    assert!(
        events.to_string().contains("is a loopback address"),
        "{events}"
    );
    assert_eq!(origin.hits(), 0);
}
