//! `postern reload` and `SIGHUP`: read the config again, validate it as at start, and put it
//! in force whole — or refuse it with every problem and keep the old one. Invocations in
//! flight keep the snapshot they started with (`config::Live`); new requests see the new
//! routes. Upstream TLS settings and idle pooled connections are dropped, so a changed
//! `upstream_ca` or `resolve` applies to the next connection.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::config::{self, Config, Live};
use crate::journal::{Body, ConfigReload, Draft, Journal, Source};

/// The labels of `postern_config_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ReloadLabels {
    pub result: &'static str,
}

pub type ReloadCounter = Family<ReloadLabels, Counter>;

/// What a reload swaps, and where the config comes from.
pub struct Reloader {
    /// The file `serve` started with; `None`: the embedded default.
    pub anchor: Option<config::Anchor>,
    pub live: Arc<Live>,
    /// The config `serve` started with: its listeners and journal settings are in force
    /// until a restart.
    pub started: Arc<Config>,
    /// Called after a swap: drops caches built from the old config.
    pub on_swap: Box<dyn Fn() + Send + Sync>,
    pub counter: ReloadCounter,
    /// Where every reload, applied or refused, is chained (`CONFIG_RELOADED`).
    pub journal: Journal,
    /// One reload at a time (SIGHUP and the API may race).
    pub running: Mutex<()>,
    /// Asked which secrets a reloaded config names that it lacks (a warning, not a refusal:
    /// secrets may be added while postern runs).
    pub vault: Arc<crate::vault::Vault>,
}

impl Reloader {
    /// Reloads; `Ok`: what changed, `Err`: every problem (the old config stays). The
    /// journal holds the reload before the new config is in force: one that cannot be
    /// journaled is not applied.
    pub async fn reload(&self) -> Result<Value, Value> {
        let _one = self.running.lock().await;
        let id = format!("rld_{}", ulid::Ulid::generate());
        let env = |name: &str| std::env::var(name).ok();
        let next = match load(self.anchor.as_ref(), &env) {
            Ok(c) => c,
            Err(problems) => {
                self.count("refused");
                tracing::warn!(
                    problems = problems.len(),
                    "config reload refused; the old config stays"
                );
                let paths = problems.iter().map(|p| p.path.clone()).collect();
                let seq = self
                    .journal_reload(&id, "refused", Value::Null, paths)
                    .await;
                let problems: Vec<Value> = problems
                    .iter()
                    .map(|p| json!({"path": p.path, "message": p.message}))
                    .collect();
                return Err(json!({
                    "reloaded": false, "problems": problems, "reload_id": id, "seq": seq.ok(),
                }));
            }
        };
        let changes = json!(config::diff_in_force(
            &self.started,
            &self.live.current(),
            &next
        ));
        let seq = match self
            .journal_reload(&id, "applied", changes.clone(), Vec::new())
            .await
        {
            Ok(seq) => seq,
            Err(e) => {
                self.count("refused");
                let message =
                    format!("the reload could not be journaled ({e}); the old config stays");
                return Err(json!({
                    "reloaded": false, "problems": [{"path": "journal", "message": message}],
                }));
            }
        };
        let warnings = super::missing_secrets(&next, &self.vault);
        self.live.swap(next);
        (self.on_swap)();
        self.count("applied");
        tracing::info!(changes = %changes, reload_id = %id, "config reloaded");
        let mut answer = json!({"reloaded": true, "changes": changes, "reload_id": id, "seq": seq});
        if !warnings.is_empty() {
            answer["warnings"] = json!(warnings);
        }
        Ok(answer)
    }

    fn count(&self, result: &'static str) {
        self.counter.get_or_create(&ReloadLabels { result }).inc();
    }

    async fn journal_reload(
        &self,
        id: &str,
        result: &str,
        changes: Value,
        problems: Vec<String>,
    ) -> Result<u64, crate::journal::JournalError> {
        let body = Body::ConfigReloaded(ConfigReload {
            result: result.to_owned(),
            changes,
            problems,
        });
        let draft = Draft::observed(body).source(Source::OperatorAttested);
        let seq = self.journal.note(id, draft).await;
        if let Err(e) = &seq {
            tracing::error!(error = %e, reload_id = %id, "config reload not journaled");
        }
        seq
    }
}

fn load(
    anchor: Option<&config::Anchor>,
    env: config::EnvLookup<'_>,
) -> Result<Config, Vec<config::Problem>> {
    let config = config::load_anchored(anchor, env).map_err(|e| e.0)?;
    let problems = crate::policy::route_problems(&config);
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(config)
}
