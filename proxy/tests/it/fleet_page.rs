//! The dashboard page of a fleet member, in headless Chromium: the fleet card appears, lists the
//! peer as up with its forwards, and says when the peer goes down.

use crate::support::*;
use fantoccini::ClientBuilder;
use serde_json::{Value, json};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Driver(std::process::Child);
impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The fleet card as the page shows it.
async fn card(c: &fantoccini::Client) -> Value {
    c.execute(
        "const f = document.getElementById('fleet');
         return { hidden: f.hidden, summary: document.getElementById('fleet-summary').textContent,
                  rows: [...f.querySelectorAll('tbody tr')].map(r => [...r.cells].map(c => c.textContent)) };",
        vec![],
    )
    .await
    .expect("execute")
}

async fn wait_card(c: &fantoccini::Client, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = card(c).await;
        if pred(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: {s}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn the_page_of_a_member_shows_its_peers() {
    if !require::chromium("drives the dashboard page in headless Chromium") {
        return;
    }
    let (origin, _rt) = origin();
    let mut f = TestFleet::start(origin.addr(), 2, "", false);
    for i in 0..20 {
        assert_eq!(
            f.client(0).get(&format!("/obj/{}", 3000 + i), &[]).status,
            200
        );
    }
    let forwarded = f.api_fleet(0)["peers"][0]["forwarded"][0]
        .as_u64()
        .expect("forwarded");
    assert!(forwarded > 0);
    let peer = f.nodes[1].addr.to_string();
    let port = free_port();
    let driver = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver");
    let _driver = Driver(driver);
    let profile = tempfile::tempdir().expect("profile");
    let caps = json!({
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--no-first-run", "--disable-background-networking",
                     format!("--user-data-dir={}", profile.path().display())]
        }
    });
    let Value::Object(caps) = caps else {
        unreachable!("a JSON object literal")
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(20);
        let browser = loop {
            match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(c) => break c,
                Err(e) => {
                    assert!(Instant::now() < deadline, "chromedriver: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        browser
            .goto(&format!("http://{}/", f.nodes[0].dashboard))
            .await
            .expect("open");
        let s = wait_card(&browser, "the fleet card with the peer up", |s| {
            s["hidden"] == false && s["rows"][0][0] == peer.as_str() && s["rows"][0][1] == "up"
        })
        .await;
        assert_eq!(s["rows"][0][4], forwarded.to_string(), "{s}");
        assert!(
            s["summary"]
                .as_str()
                .is_some_and(|t| t.contains("1/1 peers up")),
            "{s}"
        );
        f.kill(1);
        wait_card(&browser, "the peer shown down", |s| {
            s["rows"][0][1] == "down"
                && s["summary"]
                    .as_str()
                    .is_some_and(|t| t.contains("0/1 peers up"))
        })
        .await;
        browser.close().await.expect("close");
    });
}
