//! Everything of an exec before the dispatch boundary: preflight with the vault login
//! bound, the reflection guard, approval, an idle session or a fresh login, and the
//! `channel_open`. Nothing of the exec reaches the remote host here.

use russh::Channel;
use russh::client::Msg;

use super::{Run, Sessions};
use crate::config::Approval;
use crate::contract::{Code, Envelope, journal_unavailable};
use crate::journal::{Body, Draft, Failure, Preflight, rfc3339};
use crate::policy::approvals::{Held, preview};
use crate::policy::fingerprint;
use crate::ssh::screen::Screen;
use crate::ssh::upstream::{self, Login, Upstream, number_after};

impl Run {
    /// Preflight, approval and a session: a kept one for this target and credential
    /// version, or a fresh login. The login comes back for a fresh connection later.
    pub(super) async fn set_up(&mut self) -> Result<(Upstream, Login), Envelope> {
        if self.inv.journal().admit().is_err() {
            return Err(journal_unavailable());
        }
        let target = self.call.target.clone();
        let fp = fingerprint("EXEC", &target.url(), &[], self.call.command.as_bytes());
        let mut preflight = Preflight {
            route: target.id.clone(),
            fingerprint: fp.clone(),
            idempotent: false,
            credential: None,
            idempotency: None,
            safe_until_ms: None,
            retry_budget: Some(target.retry_budget),
            credential_placeholder: false,
            resend: None,
        };
        let login = match self.login_and_guard() {
            Ok(l) => l,
            Err(failure) => {
                let drafts = vec![Draft::observed(Body::PreflightValidated(preflight))];
                return Err(self.inv.fail(drafts, failure).await);
            }
        };
        preflight.credential = Some(login.evidence.clone());
        self.keep_if_stdin_ended().await;
        let drafts = vec![
            Draft::observed(Body::PreflightValidated(preflight)),
            Draft::observed(Body::CredentialAuthorized(login.evidence.clone())),
        ];
        if target.approval == Approval::Required {
            self.hold(drafts, &fp, &login).await?;
        } else if self.inv.record(drafts).await.is_err() {
            return Err(self.inv.fallback(Code::JournalUnavailable));
        }
        self.session_key = Sessions::key(&target.id, &login);
        if let Some(up) = self.sessions.take(&self.session_key) {
            self.reused = true;
            return Ok((up, login));
        }
        let up = self.connect(&login, 0).await?;
        Ok((up, login))
    }

    /// The vault login and the guard over what the remote prints (SPEC §1.8): output
    /// that cannot be screened is never relayed, so no guard means no exec.
    fn login_and_guard(&mut self) -> Result<Login, Failure> {
        let login = upstream::login(&self.config, &self.call.target, &self.vault)?;
        let Some(guard) = login.guard(&self.guards) else {
            let mut f = Failure::of(Code::InjectionModeUnsupported);
            f.diagnostic = Some("the reflection guard for this credential cannot be built".into());
            return Err(f);
        };
        self.screen = Screen::new(guard);
        Ok(login)
    }

    /// SPEC §3.5 for targets: held until approved; a login rotated meanwhile refuses.
    async fn hold(&mut self, drafts: Vec<Draft>, fp: &str, login: &Login) -> Result<(), Envelope> {
        let target = self.call.target.clone();
        let now = time::OffsetDateTime::now_utc();
        let command = self.call.command.as_bytes();
        let held = Held {
            invocation_id: self.inv.id().to_owned(),
            agent: self.call.agent.clone(),
            route: target.id.clone(),
            method: "exec".into(),
            target: target.url(),
            fingerprint: fp.to_owned(),
            requested_at: rfc3339(now),
            expires_at: rfc3339(now + target.approval_timeout),
            body_bytes: command.len(),
            body_preview: preview(command),
            credential: Some(target.credential.clone()),
            body_hex: None,
            headers: Vec::new(),
            headers_not_shown: 0,
        };
        let (config, vault) = (self.config.clone(), self.vault.clone());
        let bound = login.evidence.clone();
        let changed = move || {
            upstream::login(&config, &target, &vault)
                .map_or(true, |now| now.evidence != bound)
                .then_some(crate::contract::Code::FingerprintChanged)
        };
        let timeout = self.call.target.approval_timeout;
        let approvals = self.approvals.clone();
        self.inv
            .await_approval(&approvals, held, timeout, drafts, changed)
            .await
    }

    /// A fresh login; its stages are numbered after the `after` attempts already recorded.
    async fn connect(&mut self, login: &Login, after: u32) -> Result<Upstream, Envelope> {
        let target = self.call.target.clone();
        match upstream::connect_with(&target, login, &self.dns).await {
            Ok(mut up) => {
                number_after(&mut up.attempts, after);
                Ok(up)
            }
            Err(mut f) => {
                number_after(&mut f.attempts, after);
                let drafts = self.inv.attempt_drafts(&f.attempts);
                self.keep_exec().await;
                Err(self.inv.fail(drafts, Failure::of(f.code)).await)
            }
        }
    }

    /// The exec's channel. A kept session that cannot open one (the server closed it, or
    /// it died while idle) is replaced by a fresh login, recorded as a further attempt:
    /// this is still before the dispatch boundary, so nothing of the exec was sent on it.
    pub(super) async fn open(
        &mut self,
        mut up: Upstream,
        login: &Login,
    ) -> Result<(Upstream, Channel<Msg>), Envelope> {
        match up.open_channel().await {
            Ok(channel) => return Ok((up, channel)),
            Err(code) if !self.reused => return Err(self.channel_failed(up, code).await),
            Err(_) => {}
        }
        let tried = self.inv.attempt_drafts(&up.attempts);
        self.inv.defer(tried);
        let after = up.attempts.iter().map(|a| a.n).max().unwrap_or(0);
        up.disconnect().await;
        self.reused = false;
        let mut fresh = self.connect(login, after).await?;
        match fresh.open_channel().await {
            Ok(channel) => Ok((fresh, channel)),
            Err(code) => Err(self.channel_failed(fresh, code).await),
        }
    }

    async fn channel_failed(&mut self, up: Upstream, code: Code) -> Envelope {
        let drafts = self.inv.attempt_drafts(&up.attempts);
        self.keep_exec().await;
        let env = self.inv.fail(drafts, Failure::of(code)).await;
        up.disconnect().await;
        env
    }
}
