//! The console in a real browser: Debian's headless Chromium through chromedriver
//! (WebDriver, `fantoccini`). Sign in; a held request appears without a reload; approve
//! (the origin sees it once, the record says the console approved) and deny; reconcile an
//! `unknown` invocation from its form; suspend an agent; find an invocation by its code;
//! what an agent sent never runs. Screenshots go beside the test binaries, and to `docs/`
//! with `POSTERN_SCREENSHOTS_TO_DOCS=1`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;

use super::{ADMIN_TOKEN, CANARY, Console};
use crate::support::free_port;

/// chromedriver, stopped with the test.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chromedriver() -> (Driver, String) {
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver must be installed (tests/run installs chromium-driver)");
    let driver = Driver(child);
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (driver, format!("http://127.0.0.1:{port}"));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("chromedriver did not listen on {port}");
}

async fn browser(webdriver: &str, profile: &std::path::Path) -> Client {
    let mut caps = serde_json::Map::new();
    let args = json!([
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--window-size=1280,1000",
        format!("--user-data-dir={}", profile.display()),
    ]);
    caps.insert("goog:chromeOptions".into(), json!({ "args": args }));
    ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(webdriver)
        .await
        .expect("a Chromium session (tests/run installs chromium)")
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("{name}.png")), &png);
    if std::env::var_os("POSTERN_SCREENSHOTS_TO_DOCS").is_some() {
        let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs");
        let _ = std::fs::write(docs.join(format!("console-{name}.png")), &png);
    }
}

async fn wait_for(c: &Client, css: &str) -> fantoccini::elements::Element {
    let found = c
        .wait()
        .at_most(Duration::from_secs(15))
        .for_element(Locator::Css(css))
        .await;
    match found {
        Ok(e) => e,
        Err(e) => {
            let at = c
                .current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_default();
            panic!(
                "{css} never appeared ({e}) at {at}:\n{}",
                page_text(c).await
            )
        }
    }
}

async fn page_text(c: &Client) -> String {
    c.source().await.unwrap_or_default()
}

#[test]
fn the_console_works_in_a_real_browser() {
    let console = Console::start();
    let (_driver, webdriver) = chromedriver();
    let profile = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(drive(&console, &webdriver, profile.path()));
}

async fn drive(console: &Console, webdriver: &str, profile: &std::path::Path) {
    let c = browser(webdriver, profile).await;
    let url = |p: &str| console.daemon.url(p);
    // No session: the sign-in page; then in with the admin token.
    c.goto(&url("/ui/approvals")).await.expect("goto");
    let token = wait_for(&c, "#sign-in input[name=token]").await;
    shot(&c, "sign-in").await;
    token.send_keys(ADMIN_TOKEN).await.expect("type");
    c.find(Locator::Css("#sign-in button"))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    wait_for(&c, "section#approvals").await;

    // A held request appears without a reload; its body is text, never run.
    let body = "{\"amount\":5,\"memo\":\"<script>window.pwned=1</script><img src=x onerror=\\\"window.pwned=2\\\">\"}";
    let first = console.send("a", "payments", body);
    let card = wait_for(&c, "article.held").await;
    let id = card.attr("data-id").await.ok().flatten().expect("data-id");
    let shown = c
        .find(Locator::Css("article.held pre.body"))
        .await
        .expect("body")
        .text()
        .await
        .unwrap_or_default();
    assert!(shown.contains("<script>window.pwned=1</script>"), "{shown}");
    let pwned = c
        .execute("return window.pwned === undefined;", vec![])
        .await
        .expect("js");
    assert_eq!(pwned, json!(true), "what the agent sent ran");
    shot(&c, "approvals").await;
    c.find(Locator::Css("article.held input[name=note]"))
        .await
        .expect("note")
        .send_keys("checked the amount")
        .await
        .expect("type");
    c.find(Locator::Css("article.held button.approve"))
        .await
        .expect("approve")
        .click()
        .await
        .expect("click");
    wait_for(&c, "p.done").await;
    let (status, _, head) = first.join().unwrap_or_default();
    assert_eq!(status, 201, "{head}");
    assert_eq!(
        console.held.hits(),
        1,
        "the origin saw the approved request once"
    );
    let granted = console.event(&id, "APPROVAL_GRANTED");
    assert_eq!(granted["data"]["via"], "console", "{granted}");
    assert_eq!(granted["data"]["note"], "checked the amount", "{granted}");

    // Deny: APPROVAL_DENIED, nothing sent.
    let second = console.send("a", "payments", "{\"amount\":6}");
    wait_for(&c, "article.held button.deny")
        .await
        .click()
        .await
        .expect("click");
    wait_for(&c, "p.done").await;
    let (status, text, _) = second.join().unwrap_or_default();
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("APPROVAL_DENIED"), "{text}");
    assert_eq!(console.held.hits(), 1);

    // An unknown invocation, reconciled from its form.
    let (_, env, _) = console
        .send("a", "broken", "charge=1")
        .join()
        .unwrap_or_default();
    let unknown: serde_json::Value = serde_json::from_str(&env).unwrap_or_default();
    let unknown_id = unknown["invocation_id"]
        .as_str()
        .expect("an envelope")
        .to_owned();
    assert_eq!(unknown["error"]["outcome"], "unknown", "{env}");
    c.goto(&url("/ui/reconcile")).await.expect("goto");
    let form = format!("#unknown-{unknown_id} form.reconcile");
    wait_for(&c, &form).await;
    shot(&c, "reconcile").await;
    let select = c
        .find(Locator::Css(&format!("{form} select[name=outcome]")))
        .await
        .expect("select");
    select.select_by_value("rejected").await.expect("select");
    c.find(Locator::Css(&format!("{form} input[name=note]")))
        .await
        .expect("note")
        .send_keys("the payment provider's dashboard shows no charge")
        .await
        .expect("type");
    c.find(Locator::Css(&format!("{form} button")))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    wait_for(&c, "p.done").await;
    let reconciled = console.event(&unknown_id, "RECONCILED");
    assert!(reconciled.is_object(), "no RECONCILED event");
    assert_eq!(reconciled["source"], "operator_attested", "{reconciled}");
    assert_eq!(reconciled["data"]["outcome"], "rejected", "{reconciled}");
    assert_eq!(reconciled["data"]["via"], "console", "{reconciled}");

    // Suspend agent b from the page: its next request is AGENT_SUSPENDED.
    c.goto(&url("/ui/agents")).await.expect("goto");
    wait_for(&c, "#agent-b button.suspend")
        .await
        .click()
        .await
        .expect("click");
    wait_for(&c, "#agent-b button.resume").await;
    shot(&c, "agents").await;
    let (status, text, _) = console.send("b", "open", "x").join().unwrap_or_default();
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("AGENT_SUSPENDED"), "{text}");
    assert_eq!(console.open.hits(), 0);

    // The journal's filter finds the denied invocation by its code; its timeline.
    c.goto(&url("/ui/journal")).await.expect("goto");
    wait_for(&c, "#filter select[name=code]")
        .await
        .select_by_value("APPROVAL_DENIED")
        .await
        .expect("select");
    c.find(Locator::Css("#filter button"))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    for _ in 0..200 {
        let at = c
            .current_url()
            .await
            .map(|u| u.to_string())
            .unwrap_or_default();
        if at.contains("code=APPROVAL_DENIED") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let results = wait_for(&c, "table#results")
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(results.contains("APPROVAL_DENIED"), "{results}");
    assert!(
        !results.contains(&id),
        "the approved one is filtered out: {results}"
    );
    shot(&c, "journal").await;
    c.goto(&url(&format!("/ui/invocations/{id}")))
        .await
        .expect("goto");
    let timeline = wait_for(&c, "#timeline")
        .await
        .text()
        .await
        .unwrap_or_default();
    for kind in [
        "APPROVAL_REQUESTED",
        "APPROVAL_GRANTED",
        "DISPATCH_STARTED",
        "RESULT_COMMITTED",
    ] {
        assert!(timeline.contains(kind), "{kind} in {timeline}");
    }
    shot(&c, "invocation").await;
    let source = page_text(&c).await;
    assert!(!source.contains(CANARY), "a page shows the secret");
    c.close().await.expect("close");
}
