//! What the outer process tells the inner one (JSON in `POSTERN_JAIL_PLAN`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// The jail's private directory (relay socket, CA files, resolv.conf), inside the
    /// directory every jail of this uid covers.
    pub dir: PathBuf,
    /// `dir`'s (device, inode) as the outer process made it.
    pub dir_id: (u64, u64),
    /// Directories bound onto themselves, outermost first: the config's and the state
    /// directory's ancestors CMD could otherwise rename (and then put its own in their place).
    pub pin_dirs: Vec<PathBuf>,
    /// Directories covered by an empty read-only tmpfs (the state directory).
    pub hide_dirs: Vec<PathBuf>,
    /// Files covered by an empty file (the config file).
    pub hide_files: Vec<PathBuf>,
    /// `Proxy-Authorization` for the CONNECTs the transparent listeners make (the agent's
    /// own identity, which CMD holds anyway).
    pub authorization: Option<String>,
    /// Ports besides 443 and 80 that the agent's routes name: each gets a transparent
    /// listener too (`true`: the route's scheme is https).
    #[serde(default)]
    pub ports: Vec<(u16, bool)>,
    /// Files bound over system paths that exist (source in `dir`, target): the CA bundle over
    /// the system CA store, the jail's ssh_config over the system one.
    #[serde(default)]
    pub binds: Vec<(String, PathBuf)>,
}

impl Plan {
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn decode(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| format!("bad {}: {e}", super::PLAN_VAR))
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join(super::files::SOCKET)
    }
}
